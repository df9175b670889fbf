"""A real MLflow tracking server for the tests marked ``mlflow_server`` (``t3ar_services.cli.mlflow_server``: SQLite
backend and local artifact store under a tmp folder, on a free 127.0.0.1 port): started with a bounded wait for its
``/health``, stopped (SIGTERM to its process group, then SIGKILL) at the end, and stoppable and restartable on the
same port and store in between (the registry-down test)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

START_TIMEOUT = 180.0  # the first start creates the SQLite schema (alembic migrations): 15-45 s on a busy 2-core box


def require_mlflow() -> None:
    try:
        from t3ar_services.cli.mlflow_server import mlflow_command

        mlflow_command()
        import mlflow  # noqa: F401
    except Exception as e:
        pytest.skip(f"mlflow is not installed (the mlflow extra: scripts/setup.sh installs it): {e}")


class MlflowServer:
    def __init__(self, folder: Path, port: int) -> None:
        self.folder, self.port = folder, port
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        from t3ar_services.cli.mlflow_server import health_url, server_argv

        log = open(self.folder / "server.log", "ab")  # noqa: SIM115 - the child's, closed with the file table
        self.proc = subprocess.Popen(server_argv(self.folder, self.port), stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"the MLflow server exited ({self.proc.returncode}): {self.tail()}")
            try:
                if httpx.get(health_url(self.url), timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        pytest.fail(f"the MLflow server did not answer within {START_TIMEOUT:g} s: {self.tail()}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        except ProcessLookupError:
            pass

    def tail(self, n: int = 20) -> str:
        try:
            return "\n".join((self.folder / "server.log").read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


@contextmanager
def running_mlflow(folder: Path) -> Iterator[MlflowServer]:
    from t3ar.ports import free_port

    require_mlflow()
    folder.mkdir(parents=True, exist_ok=True)
    server = MlflowServer(folder, free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()

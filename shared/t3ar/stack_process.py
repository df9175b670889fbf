"""``t3ar up`` as a child process: started in a data directory, awaited until it writes ``stack.json``, stopped
with SIGTERM at the end. The job benchmark (:mod:`t3ar_bench.job`) and the end-to-end tests share it.

The library starts the stack through its own CLI (``python -m t3ar.cli.main up``), never by importing the
services: ``up`` reaches the CLI through the ``t3ar.commands`` entry point.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

LOG_TAIL_CHARS = 4000  # how much of the up log a start failure carries: the last service's traceback fits


class StackStartError(RuntimeError):
    """``t3ar up`` exited, or wrote no ``stack.json`` before the deadline; ``log_tail`` is the end of its log."""

    def __init__(self, reason: str, log_path: Path, log_tail: str) -> None:
        super().__init__(f"t3ar up did not start ({reason}); the end of {log_path}:\n{log_tail}")
        self.log_path = log_path
        self.log_tail = log_tail


def up_argv(data_dir: Path, workers: int = 1) -> list[str]:
    """The command line of ``t3ar up`` in ``data_dir`` on free ports (stack.json names the ones it took)."""
    return [sys.executable, "-m", "t3ar.cli.main", "up", "--data-dir", str(data_dir), "--api-port", "0",
            "--retriever-port", "0", "--workers", str(workers)]


@contextmanager
def running_up(data_dir: Path, env: Mapping[str, str], log_path: Path, *, cwd: Path | None = None,
               start_timeout: float = 300, stop_timeout: float = 120,
               argv: Sequence[str] | None = None) -> Iterator[tuple[subprocess.Popen[bytes], dict[str, Any]]]:
    """Start ``argv`` (default :func:`up_argv` of ``data_dir``) with ``env`` (the whole environment) and ``cwd``,
    its output appended to ``log_path``; yield the process and ``data_dir/stack.json`` once it exists.

    An earlier stack's ``stack.json`` is removed first (a restart in the same data directory would otherwise be
    taken as started). Raises :class:`StackStartError` when the process exits or ``start_timeout`` seconds pass
    first. On exit, and on a failed start, the process gets SIGTERM (``t3ar up`` then stops its children in
    order), ``stop_timeout`` seconds, then SIGKILL.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    info_file = data_dir / "stack.json"
    info_file.unlink(missing_ok=True)
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(list(argv or up_argv(data_dir)), env=dict(env), stdout=out,
                                stderr=subprocess.STDOUT, cwd=cwd)
        try:
            deadline = time.monotonic() + start_timeout
            while not info_file.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    reason = (f"exited with code {proc.returncode}" if proc.returncode is not None
                              else f"no stack.json after {start_timeout:g} s")
                    tail = log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
                    raise StackStartError(reason, log_path, tail)
                time.sleep(0.5)
            yield proc, json.loads(info_file.read_text())
        finally:
            stop(proc, stop_timeout)


def stop(proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    """SIGTERM, up to ``timeout`` seconds for the process to end, then SIGKILL; a no-op on an ended process."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        log.warning("pid %d still running %g s after SIGTERM; killing it", proc.pid, timeout)
        proc.kill()
        proc.wait()

"""One serving process per data directory.

Two retrievers on one pool directory both answer: a delete through one is never seen by the other's in-memory
index, so a withdrawn image comes back. Each service takes an exclusive ``flock`` on ``<data_dir>/.t3ar.lock``
for its whole life and writes its pid into it; a second process on the directory refuses to start, naming the
holder's pid. The kernel drops the lock when the holder exits, however it exits (kill -9 included): no stale
lock to clean. The lock file's descriptor is not inherited by children.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

LOCK_FILE = ".t3ar.lock"


class DataDirBusyError(RuntimeError):
    """Another live process serves the data directory."""

    def __init__(self, message: str, pid: int | None) -> None:
        super().__init__(message)
        self.pid = pid


def _pid_in(fd: int) -> int | None:
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
        return int(text.split()[0]) if text else None
    except (OSError, ValueError, IndexError):
        return None


class DataDirLock:
    """``acquire()`` the exclusive lock of ``directory`` (made if missing) for ``what`` (e.g. "the retriever"),
    or raise :class:`DataDirBusyError` naming the holder's pid; ``release()`` it."""

    def __init__(self, directory: Path, what: str) -> None:
        self.directory = Path(directory)
        self.what = what
        self.fd: int | None = None

    @property
    def path(self) -> Path:
        return self.directory / LOCK_FILE

    def acquire(self) -> DataDirLock:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pid = _pid_in(fd)
            os.close(fd)
            who = f"process {pid}" if pid else "another process"
            raise DataDirBusyError(f"{self.directory} is in use by {who} (it holds {self.path}); two processes "
                                   f"serving one data directory lose writes: stop {who} first, or give "
                                   f"{self.what} another data directory", pid) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None


def holder(directory: Path) -> int | None:
    """The pid holding ``directory``'s lock (0 when held but unnamed), or None when nobody holds it."""
    path = Path(directory) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return _pid_in(fd) or 0
    finally:
        os.close(fd)
    return None


@contextlib.asynccontextmanager
async def holding(data_dir: Path, who: str, log: logging.Logger) -> AsyncIterator[None]:
    """A service's lifespan around its data directory's lock: refuse to start (logged, then raised) when another
    live process holds it; release it when the service stops. ``who`` names the service and its setting."""
    try:
        lock = DataDirLock(data_dir, who).acquire()
    except DataDirBusyError as e:
        log.error("%s cannot start: %s", who.split(" (")[0].removeprefix("this "), e)
        raise
    try:
        yield
    finally:
        lock.release()


Serving = Callable[[Any], AbstractAsyncContextManager[None]]


def data_dir_lifespan(data_dir: Path, who: str, auth_disabled: bool, open_to: str, serving: Serving,
                      log: logging.Logger) -> Serving:
    """The lifespan of a service that serves one data directory: its lock held throughout (:func:`holding`), a
    loud warning when auth is disabled (``open_to``: what anyone who reaches the port can then do; ``who`` names
    the service and its data-dir setting, the auth setting is named after it), then ``serving(app)``."""
    setting = who.split("(", 1)[-1].split("_DATA_DIR")[0] + "_AUTH_DISABLED"

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        async with holding(data_dir, who, log):
            if auth_disabled:
                log.warning("AUTH IS DISABLED (%s=true): anyone who can reach this port can %s; use only on a "
                            "trusted local machine", setting, open_to)
            async with serving(app):
                yield

    return lifespan

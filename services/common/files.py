"""Durable files (what the services write survives a crash once these return) and guarded file names (a name a
client sent reaches the filesystem only when it names a file under a given root)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from t3ar.filemode import new_file_mode


def fsync_path(path: Path) -> None:
    """fsync a file, or a directory (which makes a rename or a new file in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: Path, mode: str = "wb", **open_kwargs: Any) -> Iterator[IO[Any]]:
    """Write ``path`` all or nothing: a temp file in the same folder, flushed and fsynced when the block ends,
    given the umask's mode (mkstemp makes 0600) and renamed over ``path``; removed instead if the block raises.
    Readers see the old file or the new one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **open_kwargs) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, new_file_mode())  # what open() would give under the umask (the services': 0600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


MAX_NAME_BYTES = 255  # one path segment, as Linux filesystems allow
MAX_PATH_BYTES = 1024  # a whole relative path (the kernel's limit is 4096; ours is what a target archive holds)


def file_inside(root: Path, name: str) -> Path | None:
    """``root / name`` when that is a file under ``root`` (``root`` resolved), else None. The name is checked
    before any of it reaches the filesystem: no NUL byte (Python refuses it with an error, not an answer), no
    segment over 255 bytes and no path over 1 KiB (ENAMETOOLONG); whatever the filesystem still says is "no"."""
    raw = name.encode("utf-8", "surrogateescape")
    if b"\x00" in raw or len(raw) > MAX_PATH_BYTES or any(len(p) > MAX_NAME_BYTES for p in raw.split(b"/")):
        return None
    try:
        path = (root / name).resolve()
        return path if path.is_relative_to(root) and path.is_file() else None
    except (OSError, ValueError):
        return None

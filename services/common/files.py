"""Durable files: what the services write survives a crash once these return."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


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
    made 0644 (mkstemp makes 0600) and renamed over ``path``; removed instead if the block raises. Readers see
    the old file or the new one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **open_kwargs) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

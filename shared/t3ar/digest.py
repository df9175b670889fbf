"""The sha256 of a file's bytes, read in chunks: one helper for weights, checkpoints, packs and contributions."""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["file_sha256"]


def file_sha256(path: Path | str, chunk: int = 1 << 20) -> str:
    """The sha256 (lower-case hex) of the file at ``path``, read ``chunk`` bytes at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()

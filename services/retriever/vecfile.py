"""Compact copies of the pool's vectors on disk: float16 rows in one file, keyed by the item's seq.

Row ``seq`` lives at byte ``seq * dim * 2`` (seqs are never reused, so a row is written once and zeroed when its
item is deleted, also after a crash: see ``store.py``; the file is sparse where ids were never used). The
compressed index (``ivfpq``) searches product quantised codes held in RAM and re-ranks its candidates exactly
against these rows, read with ``pread``: the kernel's page cache keeps the rows that are read, the process's
resident set none of them, whatever the pool's size (10 M x 512-d = 9.5 GiB on disk). A memory mapping was tried
first and measured: the kernel maps the cached neighbours of every faulted page (fault-around), so after a few
thousand re-ranked queries the mapped rows counted in the retriever's VmRSS (RssFile) grew to the whole file
(0.17 GiB more than the empty process at 200,000 vectors); ``pread`` of ~200 rows of 1 KiB per query costs well
under a millisecond.

Where the file is the pool's vectors (float16 storage, ``store.py``) the store writes it and the index only reads
it; otherwise it is derived, like the index: a start-up that cannot trust it (no saved index that vouches for it,
a size or sample that disagrees with the database) rewrites it from SQLite.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np

ROW_DTYPE = np.float16
SCATTERED_READ_MAX = 4096  # reads of more rows than this (index builds) read contiguous runs at once
_GROW = 1 << 16  # rows the file grows by at a time (64 Ki rows: 64 MiB at 512-d, sparse until written)


class VectorFile:
    """float16 rows by seq, in ``path``, read and written with ``pread``/``pwrite`` (thread-safe; several
    instances may share one file: the store writes it, the index reads it)."""

    def __init__(self, path: Path, dim: int) -> None:
        self.path, self.dim = path, dim
        self.row_bytes = dim * np.dtype(ROW_DTYPE).itemsize
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self._lock = threading.Lock()

    @property
    def rows(self) -> int:
        """Rows the file has room for (1 + the largest seq written, rounded up)."""
        return os.fstat(self._fd).st_size // self.row_bytes

    def write(self, seqs: np.ndarray, vectors: np.ndarray) -> None:
        seqs = np.asarray(seqs, dtype=np.int64)
        if not len(seqs):
            return
        top = int(seqs.max()) + 1
        with self._lock:
            rows = self.rows
            if top > rows:  # sparse: no disk blocks for rows never written
                os.ftruncate(self._fd, max(top, rows + _GROW) * self.row_bytes)
        half = np.asarray(vectors, dtype=np.float32).astype(ROW_DTYPE)
        for first, idx in _runs(seqs):
            os.pwrite(self._fd, np.ascontiguousarray(half[idx]).tobytes(), first * self.row_bytes)

    def zero(self, seqs: np.ndarray) -> None:
        """Forget these rows (a deleted item's vector does not stay on disk)."""
        seqs = np.asarray(seqs, dtype=np.int64)
        seqs = seqs[(seqs >= 0) & (seqs < self.rows)]
        for first, idx in _runs(seqs):
            os.pwrite(self._fd, bytes(len(idx) * self.row_bytes), first * self.row_bytes)

    def read(self, seqs: np.ndarray) -> np.ndarray:
        """float32 rows for these seqs (zeros for rows never written or beyond the file)."""
        seqs = np.asarray(seqs, dtype=np.int64)
        if len(seqs) > SCATTERED_READ_MAX:
            return self._pread(seqs)
        out = np.zeros((len(seqs), self.dim), np.float32)
        ok = np.nonzero((seqs >= 0) & (seqs < self.rows))[0]
        if len(ok):
            rb, fd = self.row_bytes, self._fd
            data = b"".join([os.pread(fd, rb, s * rb) for s in seqs[ok].tolist()])
            out[ok] = np.frombuffer(data, dtype=ROW_DTYPE).reshape(len(ok), self.dim)
        return out

    def _pread(self, seqs: np.ndarray) -> np.ndarray:
        out = np.zeros((len(seqs), self.dim), np.float32)
        ok = np.nonzero(seqs >= 0)[0]
        for first, idx in _runs(seqs[ok]):
            data = os.pread(self._fd, len(idx) * self.row_bytes, first * self.row_bytes)
            got = np.frombuffer(data, dtype=ROW_DTYPE).reshape(-1, self.dim)  # short past the end of the file
            out[ok[idx[:len(got)]]] = got
        return out

    def reset(self) -> None:
        """Empty the file (before a rewrite from the database)."""
        with self._lock:
            os.ftruncate(self._fd, 0)

    def flush(self) -> None:
        os.fsync(self._fd)

    def disk_bytes(self) -> int:
        return int(os.fstat(self._fd).st_blocks * 512)

    def close(self) -> None:
        os.close(self._fd)


def _runs(seqs: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Split ``seqs`` into runs of consecutive ids: (first id, positions in ``seqs`` of the run's ids in order).
    Duplicated ids are kept (a later position wins when written)."""
    if not len(seqs):
        return []
    order = np.argsort(seqs, kind="stable")
    s = seqs[order]
    breaks = np.nonzero(np.diff(s) != 1)[0] + 1
    return [(int(s[a]), order[a:b]) for a, b in zip(np.r_[0, breaks], np.r_[breaks, len(s)], strict=True)]

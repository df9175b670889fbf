"""Compact copies of the pool's vectors on disk: float16 rows in one memory-mapped file, keyed by the item's seq.

Row ``seq`` lives at byte ``seq * dim * 2`` (seqs are never reused, so a row is written once and zeroed when its
item is deleted; the file is sparse where ids were never used). The compressed index (``ivfpq``) searches product
quantised codes held in RAM and re-ranks its candidates exactly against these rows: the process maps the file and
the kernel's page cache holds the rows that are read, so the process's own (anonymous) memory stays small
whatever the pool's size (10 M x 512-d = 9.5 GiB on disk, none of it in the heap). Writes and large reads (index
builds) go through ``pwrite``/``pread``, not the mapping, so the process's resident set holds only the rows
re-ranking touched (a mapped page counts in VmRSS as ``RssFile`` once touched; cached pages that no mapping
touched do not).

The file is derived, like the index: SQLite holds every vector, a start-up that cannot trust the file (no saved
index that vouches for it, a size or sample that disagrees with the database) rewrites it from there. Writes are
not fsynced (a crash means a rebuild at the next start, exactly as for the index).
"""

from __future__ import annotations

import mmap
import os
import threading
from pathlib import Path

import numpy as np

ROW_DTYPE = np.float16
MAPPED_READ_MAX = 4096  # reads of more rows than this (index builds) use pread on contiguous runs
_GROW = 1 << 16  # rows added to the mapping at a time when the file has to grow (64 Ki rows: 64 MiB at 512-d)


class VectorFile:
    """float16 rows by seq, in ``path``. Readers never block each other; growth (remapping) takes a lock. Several
    instances may map one file (the store writes it, the index reads it): a read past this mapping's end maps the
    file's current size first."""

    def __init__(self, path: Path, dim: int) -> None:
        self.path, self.dim = path, dim
        self.row_bytes = dim * np.dtype(ROW_DTYPE).itemsize
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self._lock = threading.Lock()
        self._rows = 0
        self._mm: mmap.mmap | None = None
        self._arr: np.ndarray = np.zeros((0, dim), ROW_DTYPE)
        self._map(os.fstat(self._fd).st_size // self.row_bytes)

    def _map(self, rows: int) -> None:
        if rows <= self._rows and self._mm is not None:
            return
        size = rows * self.row_bytes
        if os.fstat(self._fd).st_size < size:
            os.ftruncate(self._fd, size)  # sparse: no disk blocks for rows never written
        if size == 0:
            return
        mm = mmap.mmap(self._fd, size)
        mm.madvise(mmap.MADV_RANDOM)  # re-ranking reads scattered rows: no read-ahead of neighbours
        self._arr = np.frombuffer(mm, dtype=ROW_DTYPE).reshape(rows, self.dim)
        self._mm, self._rows = mm, rows  # the old mapping is freed when no array views it any more

    @property
    def rows(self) -> int:
        """Rows the file has room for (1 + the largest seq written, rounded up)."""
        return self._rows

    def write(self, seqs: np.ndarray, vectors: np.ndarray) -> None:
        seqs = np.asarray(seqs, dtype=np.int64)
        if not len(seqs):
            return
        top = int(seqs.max()) + 1
        with self._lock:
            if top > self._rows:
                self._map(max(top, self._rows + _GROW))
        rows = np.asarray(vectors, dtype=np.float32).astype(ROW_DTYPE)
        for first, idx in _runs(seqs):
            os.pwrite(self._fd, np.ascontiguousarray(rows[idx]).tobytes(), first * self.row_bytes)

    def zero(self, seqs: np.ndarray) -> None:
        """Forget these rows (a deleted item's vector does not stay on disk)."""
        seqs = np.asarray(seqs, dtype=np.int64)
        seqs = seqs[(seqs >= 0) & (seqs < self._rows)]
        for first, idx in _runs(seqs):
            os.pwrite(self._fd, bytes(len(idx) * self.row_bytes), first * self.row_bytes)

    def read(self, seqs: np.ndarray) -> np.ndarray:
        """float32 rows for these seqs (zeros for rows never written or beyond the file)."""
        seqs = np.asarray(seqs, dtype=np.int64)
        arr = self._arr  # one mapping for the whole read, even if another thread grows the file meanwhile
        if len(seqs) > MAPPED_READ_MAX:
            return self._pread(seqs)
        if len(seqs) and int(seqs.max()) >= len(arr):  # another VectorFile on this path may have grown the file
            with self._lock:
                self._map(os.fstat(self._fd).st_size // self.row_bytes)
            arr = self._arr
        out = np.zeros((len(seqs), self.dim), np.float32)
        ok = (seqs >= 0) & (seqs < len(arr))
        out[ok] = arr[seqs[ok]]
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
            self._arr = np.zeros((0, self.dim), ROW_DTYPE)
            self._mm, self._rows = None, 0
            os.ftruncate(self._fd, 0)

    def flush(self) -> None:
        os.fsync(self._fd)

    def disk_bytes(self) -> int:
        return int(os.fstat(self._fd).st_blocks * 512)

    def close(self) -> None:
        self._arr = np.zeros((0, self.dim), ROW_DTYPE)
        self._mm = None
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

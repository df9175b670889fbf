"""The labels of a pool's labelled items in memory, so that a search answer carries its results' labels
without a database read per answer.

Reading them from SQLite per answer cost 30 ms for 256 x 50 results against a 20k-item pool with 10k labelled
items (the 2-core development machine, median of 20), 20 times the encoding of the whole answer; the vectorised
lookup here costs 1.5 ms (same pool and results; 0.01 ms for one query's 10). Kept as two sorted arrays (the
labelled seqs and a code per seq) and the list of distinct labels: 12 bytes an item, 12 MB for a million labelled
items.

Loaded once when the pool opens and appended to by every add under the writer lock (seqs only grow, so the
arrays stay sorted). A delete leaves its entry: a deleted seq is never answered by a search (the index drops it
before the row goes) and never reused, so the entry is never read again; the next open drops it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

import numpy as np


class LabelMap:
    """seq -> label for the labelled items (unlabelled items are not held)."""

    def __init__(self, rows: Iterable[tuple[int, str]]) -> None:
        self._lock = threading.Lock()  # appenders only; readers take the current (seqs, codes) pair as it is
        self._names: list[str] = []
        self._code: dict[str, int] = {}
        seqs, codes = [], []
        for seq, label in rows:
            seqs.append(seq)
            codes.append(self._code_of(label))
        order = np.argsort(np.asarray(seqs, dtype=np.int64), kind="stable")
        self._arrays = (np.asarray(seqs, dtype=np.int64)[order], np.asarray(codes, dtype=np.int32)[order])

    def _code_of(self, label: str) -> int:
        code = self._code.get(label)
        if code is None:
            code = self._code[label] = len(self._names)
            self._names.append(label)
        return code

    def __len__(self) -> int:
        return len(self._arrays[0])

    def add(self, seqs: Sequence[int], label: str | None) -> None:
        """These new items carry ``label`` (None: nothing to hold). Seqs are larger than any held (never reused)."""
        if label is None or not len(seqs):
            return
        with self._lock:
            code = self._code_of(label)
            held, codes = self._arrays
            new = np.asarray(seqs, dtype=np.int64)
            merged = np.concatenate([held, new])
            if len(held) and new.min() <= held[-1]:  # not expected (seqs grow); kept correct all the same
                order = np.argsort(merged, kind="stable")
                self._arrays = (merged[order], np.concatenate([codes, np.full(len(new), code, np.int32)])[order])
            else:
                self._arrays = (merged, np.concatenate([codes, np.full(len(new), code, np.int32)]))

    def seqs_of(self, label: str) -> np.ndarray:
        """The seqs held with ``label`` (sorted; may include deleted items', which no search answers)."""
        held, codes = self._arrays
        code = self._code.get(label)
        return held[codes == code] if code is not None else np.empty(0, dtype=np.int64)

    def lookup(self, seqs: np.ndarray) -> list[str | None]:
        """The label of each seq (None: unlabelled or unknown), in order."""
        held, codes = self._arrays
        if not len(held) or not len(seqs):
            return [None] * len(seqs)
        at = np.minimum(np.searchsorted(held, seqs), len(held) - 1)
        names = np.array([*self._names, None], dtype=object)  # the last one: unlabelled
        return names[np.where(held[at] == seqs, codes[at], len(names) - 1)].tolist()

    def lookup_rows(self, rows: Sequence[np.ndarray]) -> list[list[str | None]]:
        """:meth:`lookup` of each row, in one vectorised lookup."""
        flat = self.lookup(np.concatenate(rows)) if rows else []
        out, start = [], 0
        for r in rows:
            out.append(flat[start:start + len(r)])
            start += len(r)
        return out

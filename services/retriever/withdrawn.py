"""Withdrawn content: what a delete took out of the pool does not come back by re-ingest.

A withdrawal (``DELETE /pool/{id}``, ``POST /pool/delete`` unless ``withdraw`` is false, as a compaction sends it)
keeps, per image item, its sha256, its id, when, and its embedding vector (never its bytes or file name) in the
``withdrawn`` table of the pool's database, committed in the same transaction as the deletion (so it survives a
restart, on every index backend: the check is here, not in the index). An image add is then refused, item by item
(``rejected``, code ``withdrawn``, naming the withdrawn id and when), when it has the same bytes (sha256) as a
withdrawn item, or is a near-duplicate of one by the ingest's own rule (cosine of R's embeddings at or above the
pool's duplicate threshold). Only an admin's re-admit (``POST /pool/withdrawn/{id}/readmit``; at the API
``POST /pool/{id}/readmit``, audited) lifts it, and removes the kept vector with the row.

Vectors-only pools have no duplicate rule and are not screened. Vectors of another embedder identity (kept from
before a re-embedding with another R) are only compared by sha256.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

REASON_CODE = "withdrawn"


@dataclass(frozen=True)
class Withdrawal:
    """One withdrawn image: its id (never reused), content digest, when (epoch seconds) and R's identity."""

    id: str
    sha256: str
    at: float
    identity: str

    @property
    def when(self) -> str:
        return dt.datetime.fromtimestamp(self.at, dt.UTC).isoformat(timespec="seconds")

    def as_dict(self) -> dict[str, str]:
        return {"id": self.id, "sha256": self.sha256, "withdrawn_at": self.when}


def refusal(name: str, w: Withdrawal, score: float | None) -> str:
    """The message of a refused item (``score`` None: the same bytes)."""
    how = "the same bytes as" if score is None else f"a near-duplicate (cosine {score:.3f}) of"
    return (f"{name}: {how} pool item {w.id}, withdrawn at {w.when}; withdrawn content is not taken again (an admin "
            f"can re-admit it: POST /pool/{w.id}/readmit at the API)")


class WithdrawnContent:
    """The withdrawn set in memory (loaded from the store at open; the store is the source of truth)."""

    def __init__(self, identity: str, dim: int, threshold: float) -> None:
        self.identity = identity
        self.dim = dim
        self.threshold = threshold
        self._lock = threading.Lock()
        self._by_sha: dict[str, Withdrawal] = {}
        self._rows: list[Withdrawal] = []  # those comparable by vector, aligned with _vecs
        self._vecs = np.empty((0, dim), dtype=np.float32)

    def __len__(self) -> int:
        return len(self._by_sha)

    def add(self, entries: Sequence[tuple[Withdrawal, np.ndarray | None]]) -> None:
        with self._lock:
            new_rows, new_vecs = [], []
            for w, vec in entries:
                self._by_sha[w.sha256] = w
                if vec is not None and w.identity == self.identity and vec.shape == (self.dim,):
                    new_rows.append(w)
                    new_vecs.append(np.asarray(vec, dtype=np.float32))
            if new_rows:
                self._rows += new_rows
                self._vecs = np.concatenate([self._vecs, np.stack(new_vecs)])

    def remove(self, shas: Sequence[str]) -> None:
        gone = set(shas)
        with self._lock:
            for sha in gone:
                self._by_sha.pop(sha, None)
            keep = [i for i, w in enumerate(self._rows) if w.sha256 not in gone]
            if len(keep) != len(self._rows):
                self._rows = [self._rows[i] for i in keep]
                self._vecs = self._vecs[keep]

    def by_sha(self, sha: str) -> Withdrawal | None:
        return self._by_sha.get(sha)

    def by_id(self, pid: str) -> Withdrawal | None:
        with self._lock:
            return next((w for w in self._by_sha.values() if w.id == pid), None)

    def match(self, shas: Sequence[str], vecs: np.ndarray | None) -> list[tuple[Withdrawal, float | None] | None]:
        """Per item: the withdrawal it repeats (exact: score None) or is a near-duplicate of (its best cosine at or
        above the threshold), else None. ``vecs``: the items' unit vectors (None: compare bytes only)."""
        with self._lock:
            out: list[tuple[Withdrawal, float | None] | None] = [
                (w, None) if (w := self._by_sha.get(s)) is not None else None for s in shas]
            if vecs is None or not len(self._rows) or not len(shas):
                return out
            sims = np.einsum("id,jd->ij", np.asarray(vecs, dtype=np.float32), self._vecs)
            best = sims.argmax(axis=1)
            for i, j in enumerate(best.tolist()):
                if out[i] is None and sims[i, j] >= self.threshold:
                    out[i] = (self._rows[j], float(sims[i, j]))
            return out

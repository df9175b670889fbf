"""The pool: SQLite store + content-addressed blobs + the derived faiss index, and the rules that keep them
consistent.

Ordering guarantees (what makes every acknowledged write survive ``kill -9``):
- add: blob files written and fsynced -> row (with its vector) committed -> index updated -> 2xx.
- delete: saved index file invalidated -> row deletion committed (float16 storage: with a record of the rows
  to zero, which are then zeroed and fsynced) -> id tombstoned in the live index (no search started afterwards
  returns it) -> blob unlinked -> WAL checkpoint -> 2xx.
A crash between steps leaves at worst an orphan blob (swept at start-up), float16 rows still recorded to zero
(zeroed when the store opens) or an index that disagrees with the database (rebuilt from the stored vectors at
start-up; see :mod:`t3ar_services.retriever.startup`).

Public ids are ``<pool tag>-<seq>``: ``seq`` is the SQLite AUTOINCREMENT rowid and the faiss id (never
reused, so a withdrawn id never names anything again); the tag is random per pool so ids of two pools never
collide. Writers (add/delete) are serialised by one lock; searches run concurrently with each other.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from t3ar.errors import InvalidInputError
from t3ar_services.retriever.backend import PoolIndex
from t3ar_services.retriever.blobs import BlobStore
from t3ar_services.retriever.errors import NotFoundError, NotReadyError, PayloadTooLargeError
from t3ar_services.retriever.index import IndexConfig, VectorIndex, marker_path
from t3ar_services.retriever.labelmap import LabelMap
from t3ar_services.retriever.store import NewItem, Store
from t3ar_services.retriever.training import IndexTrainer, build_index, flat_cap, least_to_train
from t3ar_services.retriever.withdrawn import REASON_CODE, Withdrawal, WithdrawnContent, refusal

log = logging.getLogger(__name__)

AddStatus = Literal["added", "exists", "duplicate", "rejected"]
MAX_SEQ = 2**63 - 1  # SQLite INTEGER and faiss ids are signed 64-bit: no id is larger
DupTarget = tuple[Literal["pool", "batch"], int]


@dataclass
class Candidate:
    """A decoded, valid uploaded image waiting to be committed."""

    name: str
    data: bytes
    sha256: str
    media_type: str | None
    width: int
    height: int
    vector: np.ndarray | None = None


@dataclass
class AddOutcome:
    name: str
    status: AddStatus
    id: str | None = None
    sha256: str | None = None
    duplicate_of: str | None = None
    score: float | None = None
    error: dict[str, str] | None = None

    @classmethod
    def rejected(cls, name: str, code: str, message: str, sha256: str | None = None) -> AddOutcome:
        return cls(name, "rejected", sha256=sha256, error={"code": code, "message": message})


@dataclass
class PoolInfo:
    data_dir: Path
    identity: str
    dim: int
    kind: Literal["images", "vectors"]
    tag: str
    index_config: IndexConfig
    duplicate_threshold: float
    backend: str = "faiss"
    repairs: list[str] = field(default_factory=list)


class Pool:
    def __init__(self, info: PoolInfo, store: Store, blobs: BlobStore) -> None:
        self.info = info
        self.store = store
        self.blobs = blobs
        self.index: PoolIndex | None = None  # a VectorIndex (faiss) or a MilvusIndex (see backend.py)
        self.index_path = info.data_dir / "index" / "faiss.index"
        self.persisted = False  # True while the saved index file equals the live index
        self._writer = threading.Lock()
        self._writes = 0
        self._source_cache: dict[str, tuple[int, np.ndarray]] = {}
        self._cache_lock = threading.Lock()
        self.labels = LabelMap(store.labelled_rows())  # the labelled items' labels, for search answers
        self.last_delete = 0.0
        self.compact_wanted = threading.Event()
        self.index_grew = threading.Event()  # wakes the background IVF trainer
        self.trainer: IndexTrainer | None = None  # set once it runs: adds over flat_cap() wait for its first swap
        self.held_s = 0.0  # seconds adds waited at the flat cap (GET /stats)
        self._held_lock = threading.Lock()
        self.withdrawn = WithdrawnContent(info.identity, info.dim, info.duplicate_threshold)
        self.withdrawn.add([(Withdrawal(pid, sha, at, ident), vec) for sha, pid, at, ident, vec
                            in store.withdrawn_rows()])

    # --- ids --------------------------------------------------------------------------------------------
    def format_id(self, seq: int) -> str:
        return f"{self.info.tag}-{seq}"

    def parse_id(self, pid: str) -> int | None:
        """The seq of a well-formed id of this pool (``<tag>-<n>``, 1 <= n < 2^63, ASCII digits without
        leading zeros), else None."""
        tag, sep, num = pid.partition("-")
        if tag != self.info.tag or not sep or not (num.isascii() and num.isdigit()) or num[0] == "0" \
                or len(num) > len(str(MAX_SEQ)) or int(num) > MAX_SEQ:
            return None
        return int(num)

    def require_seq(self, pid: str) -> int:
        seq = self.parse_id(pid)
        if seq is None:
            raise NotFoundError(f"no item {pid!r} in this pool (ids look like {self.info.tag}-123)")
        return seq

    def live_index(self) -> PoolIndex:
        if self.index is None:
            raise NotReadyError("the index is still loading or being rebuilt; retry in a moment")
        return self.index

    def invalidate_persisted(self) -> None:
        """Remove the saved index (it would no longer describe the pool, and after a delete it must not keep
        the deleted vector on disk). Done right after loading it, and again before any write as a guard."""
        if self.persisted:
            marker_path(self.index_path).unlink(missing_ok=True)
            self.index_path.unlink(missing_ok=True)
            self.persisted = False

    # --- add --------------------------------------------------------------------------------------------
    def hold_while_flat(self, index: PoolIndex, n: int) -> None:
        """Backpressure before the first IVF training: while a pool of a trained kind still searches its exact
        index, an add of ``n`` vectors that would take it past :func:`~t3ar_services.retriever.training.flat_cap`
        (count plus batch: issue 50, N10) waits (up to ``flat_wait_s``) for the training to swap in, then answers
        503 with a ``Retry-After``; only while a trainer runs (nothing else would lift it). When the exact index
        holds too few vectors for a training to start, waiting would not help: 413, nothing added (send fewer at
        once). Called outside the writer lock: deletes go on meanwhile."""
        config, trainer = self.info.index_config, self.trainer
        cap = flat_cap(config)
        if cap is None or not isinstance(index, VectorIndex) or index.kind != "flat" or index.count + n <= cap:
            return
        if index.count < least_to_train(config):
            raise PayloadTooLargeError(
                f"{n:,} vectors would take the pool's exact index from {index.count:,} to {index.count + n:,}, past "
                f"the {cap:,} it holds before its first {config.kind} training (T3AR_RETRIEVER_IVF_FLAT_MAX), and "
                f"that training starts from {least_to_train(config):,}: send at most {cap - index.count:,} now, "
                "then the rest (later adds wait for the training)")
        if trainer is None:
            return
        start = time.monotonic()
        try:
            while index.kind == "flat" and index.count + n > cap and trainer.is_alive():
                if time.monotonic() >= start + config.flat_wait_s:
                    why = f" (its last attempt failed: {trainer.last_error})" if trainer.last_error else ""
                    raise NotReadyError(
                        f"the pool holds {index.count:,} vectors on its exact index, the most it takes before its "
                        f"first {config.kind} training is in (T3AR_RETRIEVER_IVF_FLAT_MAX: {cap:,}); that training "
                        f"runs in the background{why}: retry shortly", retry_after=10)
                self.index_grew.set()  # the trainer looks again (a no-op while it builds)
                time.sleep(0.2)
        finally:
            if (waited := time.monotonic() - start) > 0.1:
                log.info("an add waited %.1fs at the flat cap (%d vectors) for the first %s training", waited, cap,
                         config.kind)
                with self._held_lock:
                    self.held_s += waited

    def refuse_withdrawn(self, entries: Sequence[Candidate | AddOutcome]) -> list[Candidate | AddOutcome]:
        """Each candidate that repeats withdrawn content (same bytes, or a near-duplicate by the ingest's rule)
        becomes a ``rejected`` outcome naming the withdrawal (see :mod:`.withdrawn`); order is kept."""
        cands = [(i, e) for i, e in enumerate(entries) if isinstance(e, Candidate)]
        if not cands or not len(self.withdrawn):
            return list(entries)
        with_vecs = all(c.vector is not None for _, c in cands)
        found = self.withdrawn.match([c.sha256 for _, c in cands],
                                     np.stack([_vec(c) for _, c in cands]) if with_vecs else None)
        out = list(entries)
        for (i, c), hit in zip(cands, found, strict=True):
            if hit is not None:
                out[i] = AddOutcome.rejected(c.name, REASON_CODE, refusal(c.name, *hit), c.sha256)
        return out

    def known_shas(self, shas: Sequence[str]) -> dict[str, str]:
        return {sha: self.format_id(seq) for sha, seq in self.store.find_sha(list(shas)).items()}

    def add(self, entries: Sequence[Candidate | AddOutcome], *, source: str, metadata: dict[str, Any],
            policy: Literal["skip", "keep"], label: str | None = None) -> list[AddOutcome]:
        """Commit the candidates (vectors filled in), each with ``label`` (None: unlabelled), report per entry in
        input order. An ``exists`` entry keeps the label it was stored with (an add never relabels).

        Exact duplicates (same sha256 as an item in the pool or earlier in the batch) are ``exists`` and
        never stored twice. Near-duplicates (cosine >= threshold) get ``duplicate_of``; with policy
        ``skip`` they are ``duplicate`` and not stored, with ``keep`` they are ``added``.
        """
        index = self.live_index()
        if any(isinstance(e, Candidate) for e in entries):
            self.hold_while_flat(index, sum(isinstance(e, Candidate) for e in entries))
        with self._writer:
            entries = self.refuse_withdrawn(entries)  # again under the lock: a delete may have come meanwhile
            out: list[AddOutcome | None] = [e if isinstance(e, AddOutcome) else None for e in entries]
            cands = [(i, e) for i, e in enumerate(entries) if isinstance(e, Candidate)]
            known = self.store.find_sha([c.sha256 for _, c in cands], writer=True)
            first_in_batch: dict[str, int] = {}
            fresh: list[tuple[int, Candidate]] = []
            for i, c in cands:
                if c.sha256 in known:
                    out[i] = AddOutcome(c.name, "exists", self.format_id(known[c.sha256]), c.sha256,
                                        duplicate_of=self.format_id(known[c.sha256]), score=1.0)
                elif c.sha256 in first_in_batch:
                    out[i] = AddOutcome(c.name, "exists", sha256=c.sha256)  # id filled in below
                else:
                    first_in_batch[c.sha256] = i
                    fresh.append((i, c))
            accepted, dup_of = self._near_duplicates(index, fresh, policy)
            to_insert = [(i, c) for i, c in fresh if i in accepted]
            seq_of: dict[int, int] = {}
            if to_insert:
                self.blobs.write_many([(c.sha256, c.data) for _, c in to_insert])
                self.invalidate_persisted()
                seqs = self.store.insert([
                    NewItem(c.sha256, source, metadata, c.name, c.media_type, len(c.data), c.width, c.height,
                            _vec(c), label=label) for _, c in to_insert])
                self.labels.add(seqs, label)  # before the index: a search that finds them knows their label
                self._writes += 1
                seq_of = {i: s for (i, _), s in zip(to_insert, seqs, strict=True)}
                vecs = np.stack([_vec(c) for _, c in to_insert])
                self._index_add(index, np.asarray(seqs, dtype=np.int64), vecs)
            for i, c in fresh:
                target, score = dup_of.get(i, (None, None))
                if isinstance(target, tuple):
                    target_id = self.format_id(seq_of[target[1]] if target[0] == "batch" else target[1])
                else:
                    target_id = None
                out[i] = AddOutcome(c.name, "added" if i in seq_of else "duplicate",
                                    self.format_id(seq_of[i]) if i in seq_of else None, c.sha256, target_id, score)
            for i, c in cands:  # repeats of a sha256 earlier in this batch point at that entry's outcome
                o, j = out[i], first_in_batch.get(c.sha256)
                if o is not None and o.status == "exists" and o.id is None and j is not None:
                    first = out[j]
                    assert first is not None
                    o.id = first.id
                    o.duplicate_of, o.score = first.id or first.duplicate_of, 1.0
        return [o for o in out if o is not None]

    def _near_duplicates(self, index: PoolIndex, fresh: list[tuple[int, Candidate]],
                         policy: Literal["skip", "keep"]) -> tuple[set[int], dict[int, tuple[DupTarget, float]]]:
        """Which fresh entries to store, and each near-duplicate's closest match with its cosine: a pool item
        (``("pool", seq)``) or an earlier entry of this batch that is stored (``("batch", entry index)``)."""
        thr = self.info.duplicate_threshold
        dup_of: dict[int, tuple[DupTarget, float]] = {}
        accepted: set[int] = set()
        if not fresh:
            return accepted, dup_of
        vecs = np.stack([_vec(c) for _, c in fresh])
        scores, seqs = index.search(vecs, 1)
        sims = np.einsum("id,jd->ij", vecs, vecs)  # not `@`: numpy's threaded BLAS costs ~30 ms CPU here when busy
        for a, (i, _) in enumerate(fresh):
            best: tuple[DupTarget, float] | None = None
            if len(seqs[a]) and scores[a][0] >= thr:
                best = (("pool", int(seqs[a][0])), float(scores[a][0]))
            for b in np.nonzero(sims[a, :a] >= thr)[0].tolist():
                j = fresh[b][0]
                if j in accepted and (best is None or sims[a, b] > best[1]):
                    best = (("batch", j), float(sims[a, b]))
            if best is not None:
                dup_of[i] = best
            if best is None or policy == "keep":
                accepted.add(i)
        return accepted, dup_of

    def add_vectors(self, vectors: np.ndarray, *, source: str, metadata: dict[str, Any],
                    label: str | None = None) -> list[str]:
        """Vector-only items (vectors-only pools): normalised, committed, indexed; no duplicate check."""
        index = self.live_index()
        self.hold_while_flat(index, len(vectors))
        with self._writer:
            self.invalidate_persisted()
            seqs = self.store.insert_vectors(vectors, source, metadata, label)
            self.labels.add(seqs, label)
            self._writes += 1
            self._index_add(index, np.asarray(seqs, dtype=np.int64), vectors)
        return [self.format_id(s) for s in seqs]

    def _settle(self, index: PoolIndex) -> None:
        """Put the index right after earlier failed writes, if it needs it (the caller holds the writer lock)."""
        if index.pending:
            index.settle(lambda seqs: {s: v for s in seqs if (v := self.store.vector(s)) is not None})

    def _index_add(self, index: PoolIndex, seqs: np.ndarray, vecs: np.ndarray) -> None:
        self._settle(index)
        try:
            index.add(seqs, vecs)
            self.index_grew.set()
        except Exception:
            if index.persistent:  # e.g. Milvus failed: withdraw the committed rows, answer 503
                rows = self.store.delete(seqs.tolist())
                self.blobs.unlink_many(r.sha256 for r in rows if r.sha256)
                index.discard_failed_add(seqs.tolist())
                raise
            # faiss: the rows are committed, make the index agree again rather than fail the add
            log.exception("index add failed after commit; rebuilding the index from the database")
            self.index = build_index(self.info.dim, self.info.index_config, self.store.count(),
                                     lambda: self.store.iter_vectors(self.info.dim))

    # --- delete -----------------------------------------------------------------------------------------
    def delete(self, ids: Sequence[str], *, missing_ok: bool, withdraw: bool = True) -> tuple[list[str], list[str]]:
        """Delete all given ids (or none: unknown ids raise NotFoundError unless ``missing_ok``).
        Returns (deleted, not_found). On return no search started afterwards returns a deleted id.
        ``withdraw``: the deleted images' content is refused at ingest from now on (:mod:`.withdrawn`); a
        compaction, which keeps a near-duplicate of what it removes, passes False."""
        index = self.live_index()
        parsed = {pid: self.parse_id(pid) for pid in dict.fromkeys(ids)}
        with self._writer:
            wanted = [s for s in parsed.values() if s is not None]
            existing = {r.seq for r in self.store.get_many(wanted)}
            not_found = [pid for pid, s in parsed.items() if s is None or s not in existing]
            if not_found and not missing_ok:
                shown = ", ".join(not_found[:10]) + (" ..." if len(not_found) > 10 else "")
                raise NotFoundError(f"{len(not_found)} unknown id(s): {shown}; nothing was deleted "
                                    "(pass missing_ok to delete the others)")
            if not existing:
                return [], not_found
            self.invalidate_persisted()
            self._settle(index)
            kept = self._withdrawals(sorted(existing)) if withdraw else []
            index.remove_before_commit(sorted(existing))  # Milvus: acknowledged by it before the rows go
            rows = self.store.delete(sorted(existing), withdrawn=kept)
            self.withdrawn.add([(Withdrawal(pid, sha, at, ident), vec) for sha, pid, at, ident, vec in kept])
            self._writes += 1
            index.remove_after_commit([r.seq for r in rows])  # faiss: tombstoned at once, compacted later
            self.blobs.unlink_many(r.sha256 for r in rows if r.sha256)
            if not self.store.checkpoint():
                log.warning("WAL checkpoint busy after delete; deleted bytes leave the WAL at the next one")
            self.last_delete = time.monotonic()
            self.compact_wanted.set()
        deleted = {r.seq for r in rows}
        return [pid for pid, s in parsed.items() if s in deleted], not_found

    def _withdrawals(self, seqs: Sequence[int]) -> list[tuple[str, str, float, str, np.ndarray]]:
        """What a withdrawal of these (existing) items keeps: their image rows' (sha256, id, now, identity,
        vector); vectors-only items have no content to refuse."""
        now = time.time()
        out = []
        for row in self.store.get_many(seqs):
            vec = self.store.vector(row.seq) if row.sha256 else None
            if row.sha256 and vec is not None:
                out.append((row.sha256, self.format_id(row.seq), now, self.info.identity, vec))
        return out

    def withdrawal(self, pid: str) -> Withdrawal | None:
        """The withdrawal of image item ``pid`` (None: not withdrawn, re-admitted, or not an image)."""
        return self.withdrawn.by_id(pid)

    def readmit(self, pid: str) -> Withdrawal:
        """An admin lifts the withdrawal of ``pid``: its content may be added again (as a new item)."""
        with self._writer:
            w = self.withdrawn.by_id(pid)
            if w is None:
                raise NotFoundError(f"no withdrawn image {pid!r} (never withdrawn, already re-admitted, or not an "
                                    "image item)")
            self.store.readmit([w.sha256])
            self.withdrawn.remove([w.sha256])
        return w

    # --- search -----------------------------------------------------------------------------------------
    def source_seqs(self, source: str) -> np.ndarray:
        """Ids with this source tag, cached until the next write (a stale set can only include deleted ids,
        which the index filters anyway, or miss ids being added at this moment)."""
        writes = self._writes
        with self._cache_lock:
            hit = self._source_cache.get(source)
        if hit is None or hit[0] != writes:
            hit = (writes, self.store.seqs_for_source(source))
            with self._cache_lock:
                self._source_cache[source] = hit
                while len(self._source_cache) > 64:
                    self._source_cache.pop(next(iter(self._source_cache)))
        return hit[1]

    def search(self, queries: np.ndarray, k: int, *, r: int = 1, seed: int = 0, exclude_ids: Sequence[str] = (),
               source: str | None = None, label: str | None = None) -> list[tuple[list[str], np.ndarray]]:
        """Per query: (ids, scores) best first, top-k (or, with r > 1, k sampled uniformly from the top r*k,
        seeded). Rows are shorter than k when fewer items qualify; never a missing-result placeholder."""
        tag = self.info.tag
        return [([f"{tag}-{s}" for s in seqs.tolist()], scores)
                for seqs, scores in self.search_seqs(queries, k, r=r, seed=seed, exclude_ids=exclude_ids,
                                                     source=source, label=label)]

    def search_seqs(self, queries: np.ndarray, k: int, *, r: int = 1, seed: int = 0,
                    exclude_ids: Sequence[str] = (), source: str | None = None,
                    label: str | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
        """:meth:`search` with sequence numbers (int64 rows) instead of public ids: the search answer writes
        the ids itself (``t3ar_services.retriever.routes.search_json``). ``label``: only items labelled with it
        (the label map may still hold a deleted item's seq; the index never answers a deleted one)."""
        index = self.live_index()
        if index.pending:  # rare: only after a failed write
            with self._writer:
                try:
                    self._settle(index)
                except NotReadyError:  # still failing: ghosts stay excluded, the search goes on without the rest
                    log.warning("Milvus could not be settled before a search; retried at the next call")
        if queries.ndim != 2 or queries.shape[1] != self.info.dim:
            raise InvalidInputError(f"query vectors must have shape [n, {self.info.dim}] for this pool "
                                    f"({self.info.identity}); got {list(queries.shape)}")
        if not np.isfinite(queries).all():
            raise InvalidInputError("query vectors contain NaN or infinity; send finite floats")
        exclude = [s for s in (self.parse_id(p) for p in exclude_ids) if s is not None]
        allowed = self.source_seqs(source) if source is not None else None
        if label is not None:
            of_label = self.labels.seqs_of(label)
            allowed = of_label if allowed is None else np.intersect1d(allowed, of_label, assume_unique=True)
        scores, seqs = index.search(queries, k * r, exclude=exclude, allowed=allowed)
        if r == 1:
            return list(zip(seqs, scores, strict=True))
        rng = np.random.default_rng(seed)  # ~20 us: only when sampling
        out = []
        for row_s, row_i in zip(scores, seqs, strict=True):
            if len(row_i) > k:
                pick = np.sort(rng.choice(len(row_i), size=k, replace=False))  # sorted: best first
                row_s, row_i = row_s[pick], row_i[pick]
            out.append((row_i, row_s))
        return out

    def result_labels(self, rows: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[list[str | None]] | None:
        """The label of each result of these search rows (None: unlabelled), or None when the pool holds no
        labelled item (the answer then leaves labels out: no bytes spent on nulls). See :mod:`.labelmap`."""
        if not len(self.labels):
            return None
        return self.labels.lookup_rows([seqs for seqs, _ in rows])

    def stats(self) -> dict[str, Any]:
        index = self.index
        return {
            "count": self.store.count(), "dim": self.info.dim, "identity": self.info.identity,
            "kind": self.info.kind, "pool_tag": self.info.tag, "sources": self.store.sources(),
            "labels": self.store.labels(),
            "backend": self.info.backend, "vector_storage": self.store.vector_storage,
            "index": {"type": index.kind if index else self.info.index_config.kind,
                      "configured_type": self.info.index_config.kind,
                      "vectors": index.count if index else None,
                      "tombstones": index.tombstones if index else 0,
                      "nlist": index.nlist if index else None, "device": index.device if index else None,
                      "trained_on": index.trained_on if index else None,
                      "flat_cap": flat_cap(self.info.index_config), "adds_held_s": round(self.held_s, 3),
                      "nprobe": index.nprobe if index and index.kind in ("ivf", "ivfpq") else None},
            "duplicate_threshold": self.info.duplicate_threshold, "ready": index is not None,
            "repairs": list(self.info.repairs),
        }


def _vec(c: Candidate) -> np.ndarray:
    if c.vector is None:
        raise ValueError(f"{c.name}: candidate was not embedded")
    return c.vector

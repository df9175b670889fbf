"""The derived faiss index over the pool's vectors, safe for concurrent searches.

- ``flat``: ``IndexIDMap2(IndexFlatIP)``, exact inner product (the paper). ``ivf``: ``IndexIVFFlat`` (inner
  product, native ids, removal supported), trained on the stored vectors when the index is built. ``ivfpq``:
  ``IndexIVFPQ`` (the same lists, each vector held as ``pq_m`` bytes of product-quantised code instead of
  ``4 * dim``), whose ``rerank * k`` candidates are re-scored exactly against the float16 rows of a
  :class:`~t3ar_services.retriever.vecfile.VectorFile` (on disk, read with ``pread``) before the top k are returned: the
  compressed index for pools that do not fit in RAM as float32 (10 M x 512-d: 640 MiB of codes, 9.5 GiB on disk).
- ids are the store's ``seq`` (int64, never reused); faiss' ``-1`` (missing result) is never returned.
- Concurrency: searches hold the read side of a writer-preferring RW lock; ``add`` and physical removal hold
  the write side (faiss is not safe for a write concurrent with searches).
- Deletion is two-phase so that it is immediate without waiting for running searches or paying faiss'
  O(N) ``remove_ids`` (~30-120 ms at 1M vectors): :meth:`remove` puts the ids in a tombstone set that every
  search started afterwards filters out; :meth:`compact` later removes them from faiss physically.
- Rebuild off to the side (the background IVF training, :mod:`t3ar_services.retriever.training`):
  :meth:`begin_rebuild` starts a journal of the adds and removes that arrive while a new index is built from a
  snapshot; :meth:`finish_rebuild` replays it into the new index and swaps it in under the write lock. The
  tombstone set belongs to this object, not to the faiss index, so it filters the new index too, and ids
  compacted out of the old index during the build go back into it (the snapshot may still hold them).
- An optional :class:`~t3ar.torch_search.TorchFlat` mirror (``IndexConfig.device``) answers
  exact searches with a matrix product on a torch device (a GPU); faiss keeps the host copy for persistence.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import faiss
import numpy as np

from t3ar_services.common.files import fsync_path
from t3ar_services.retriever.vecfile import VectorFile

F: Any = faiss  # the bundled stubs are incomplete (kwargs constructors, IVF attributes)

log = logging.getLogger(__name__)

IndexKind = Literal["flat", "ivf", "ivfpq"]
TRAINED: tuple[IndexKind, ...] = ("ivf", "ivfpq")  # the kinds trained on the pool's vectors (inverted lists)
RERANK_MIN_EXTRA = 64  # at least this many candidates beyond k (a k=1 near-duplicate check still sees 65)
RERANK_CHUNK = 64  # queries re-ranked at a time (bounds the gathered candidate rows: 64 x 200 x 512 x 4 B = 26 MiB)
SELECTOR_MIN_DROP = 2048  # above this many excluded/tombstoned ids, filter inside faiss instead of over-fetching
SMALL_BATCH = 20  # faiss' own BLAS threshold: fewer queries are scanned without matrix multiplication


def search_threads(n_queries: int, configured: int) -> int:
    """OpenMP threads for one search: 1 for a few queries (the scan is memory-bound, and a second thread mostly
    adds barrier waits, badly so when the cores are busy with other searches), else ``configured`` (0 = all)."""
    if n_queries < SMALL_BATCH:
        return 1
    return configured if configured > 0 else (os.cpu_count() or 1)


class RWLock:
    """Many readers or one writer; a waiting writer blocks new readers (no writer starvation)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    @contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


@dataclass(frozen=True)
class IndexConfig:
    kind: IndexKind = "flat"
    nlist: int = 1024
    nprobe: int = 32
    threads: int = 0
    device: str | None = None  # a torch device for exact search (TorchFlat mirror of a flat index); None = faiss
    train_min: int = 0  # ivf: below this many vectors the index is flat (exact); see training.py
    retrain_growth: float = 2.0  # ivf: retrain once the pool holds this many times the vectors trained on
    flat_max: int = 0  # ivf: most vectors on the exact index before the first training swaps in (0: 2 x train_min)
    flat_wait_s: float = 20.0  # ivf: how long an add over flat_max waits for that swap before its 503
    pq_m: int = 64  # ivfpq: bytes of code per vector (sub-quantisers of 8 bits; must divide the dimension)
    rerank: int = 4  # ivfpq: candidates re-scored exactly per result wanted (k * rerank, at least k + 64)
    vector_file: Path | None = None  # ivfpq: where the float16 rows for re-ranking live (vecfile.VectorFile)
    vectors_shared: bool = False  # the file is the store's own (float16 storage): read, never written, by the index

    @property
    def trained(self) -> bool:
        return self.kind in TRAINED

    def marker(self) -> dict[str, Any]:
        """What a saved index must have been configured with to be loaded under this configuration."""
        return {"configured_type": self.kind, "configured_nlist": self.nlist if self.trained else None,
                **({"configured_pq_m": self.pq_m} if self.kind == "ivfpq" else {})}


@dataclass
class _Journal:
    """What changed while a new index was being built off to the side: the adds' seqs with their vectors, or with
    None where the index's float16 rows hold them (``ivfpq``: read back at the swap; a copy here would hold every
    vector added during a long rebuild in float32, 2 KiB each at 512-d: a 10 M ingest outran the first training
    and the retriever reached 22 GiB), and the seqs removed."""

    adds: list[tuple[np.ndarray, np.ndarray | None]]
    removed: set[int]


def _as_f32(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32)


class VectorIndex:
    def __init__(self, index: Any, dim: int, kind: IndexKind, nprobe: int = 32) -> None:
        self._index: Any = index
        self.vectors: VectorFile | None = None  # ivfpq: float16 rows for re-ranking, kept up to date by add/remove
        self.owns_vectors = True  # False: the rows are the store's (float16 storage), written and zeroed by it
        self.rerank = 4
        self.threads = 0  # OpenMP threads for large query batches (0 = all cores); see search_threads()
        self.dim = dim
        self.kind: IndexKind = kind
        self.nprobe = nprobe
        self._lock = RWLock()
        self._tomb: frozenset[int] = frozenset()
        self._tomb_lock = threading.Lock()
        self._journal: _Journal | None = None
        self.trained_on: int | None = None  # IVF: vectors in the index when it was trained
        self._mirror: Any = None  # TorchFlat while kind == "flat" and a device is configured

    # --- construction -----------------------------------------------------------------------------
    @classmethod
    def build(cls, dim: int, config: IndexConfig, batches: Iterable[tuple[np.ndarray, np.ndarray]]) -> VectorIndex:
        """Build from ``(seqs, vectors)`` batches. IVF needs data to train: with fewer than 39 vectors per
        list it uses fewer lists, and an empty pool gets a flat index (rebuilt as IVF at a later start)."""
        vf = open_vector_file(dim, config, reset=True)
        if vf is not None and not config.vectors_shared:
            batches = _writing(vf, batches)
        built = cls._build(dim, config, batches)
        built.threads = config.threads
        built.vectors, built.rerank, built.owns_vectors = vf, config.rerank, not config.vectors_shared
        built.attach_device(config.device)
        return built

    def attach_device(self, device: str | None) -> None:
        """Mirror a flat index on a torch ``device`` for exact search (no-op for IVF or ``None``)."""
        if device is None or self.kind != "flat":
            return
        from t3ar.torch_search import TorchFlat

        with self._lock.write():
            self._mirror = TorchFlat.from_faiss(self._index, device)

    @property
    def device(self) -> str | None:
        return self._mirror.device_name if self._mirror is not None else None

    @classmethod
    def _build(cls, dim: int, config: IndexConfig, batches: Iterable[tuple[np.ndarray, np.ndarray]]) -> VectorIndex:
        if config.kind == "flat":
            index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
            for seqs, vecs in batches:
                index.add_with_ids(_as_f32(vecs), seqs.astype(np.int64))
            return cls(index, dim, "flat")
        parts = list(batches)
        n = sum(len(s) for s, _ in parts)
        nlist = min(config.nlist, n // 39)
        if nlist < 1 or n < config.train_min or n < min_to_train(config):
            log.info("ivf index requested but the pool has %d vectors (trained from %d): exact flat index for now",
                     n, max(config.train_min, 39))
            return cls._build(dim, IndexConfig("flat"), parts)
        if nlist < config.nlist:
            log.warning("ivf: %d vectors train only %d lists (configured %d)", n, nlist, config.nlist)
        rng = np.random.default_rng(0)
        frac = min(1.0, nlist * (64 if config.kind == "ivfpq" else 256) / n)  # as training.py
        sample = np.concatenate([v[rng.random(len(v)) < frac] for _, v in parts])  # no full copy of the pool
        ivf = new_trained(dim, config, nlist, sample)
        for seqs, vecs in parts:
            ivf.add_with_ids(_as_f32(vecs), seqs.astype(np.int64))
        ivf.nprobe = min(config.nprobe, nlist)
        out = cls(ivf, dim, config.kind, ivf.nprobe)
        out.trained_on = n
        return out

    # --- rebuild off to the side --------------------------------------------------------------------------
    def begin_rebuild(self) -> None:
        """Start journaling adds and removes; call before reading the snapshot the new index is built from."""
        with self._lock.write(), self._tomb_lock:
            self._journal = _Journal([], set())

    def abort_rebuild(self) -> None:
        with self._lock.write(), self._tomb_lock:
            self._journal = None

    def finish_rebuild(self, new: VectorIndex, snapshot_seqs: np.ndarray) -> int:
        """Swap ``new``'s faiss index in (built from a snapshot holding ``snapshot_seqs``, read after
        :meth:`begin_rebuild`): journaled adds it lacks are added to it first, and every tombstone (including
        ids compacted out of the old index during the build) that names a vector of the new index is kept;
        searches see either the old or the new index, never a mix. Returns the number of replayed vectors."""
        held = np.unique(np.asarray(snapshot_seqs, dtype=np.int64))  # sorted: membership by binary search
        replayed: list[np.ndarray] = []
        with self._lock.write():
            journal = self._journal
            if journal is None:
                raise RuntimeError("finish_rebuild without begin_rebuild")
            for seqs, vecs in journal.adds:  # adds committed after (or while) the snapshot was read
                fresh = ~_member(held, seqs)
                if fresh.any():
                    rows = self._journaled_rows(seqs[fresh], None if vecs is None else vecs[fresh])
                    new._index.add_with_ids(rows, seqs[fresh])
                    if new._mirror is not None:
                        new._mirror.add(seqs[fresh], rows)
                    replayed.append(seqs[fresh])
            extra = np.unique(np.concatenate(replayed)) if replayed else np.empty(0, np.int64)
            with self._tomb_lock:
                # ids compacted out of the old index during the build may still be in the snapshot; tombstones
                # of ids the new index does not hold would only skew its count
                tomb = np.fromiter(self._tomb | journal.removed, dtype=np.int64)
                self._tomb = frozenset(tomb[_member(held, tomb) | _member(extra, tomb)].tolist())
                self._journal = None
            self._index, self.kind, self.nprobe, self.trained_on = new._index, new.kind, new.nprobe, new.trained_on
            self._mirror = new._mirror
        return int(sum(len(r) for r in replayed))

    def _journaled_rows(self, seqs: np.ndarray, vecs: np.ndarray | None) -> np.ndarray:
        """float32 rows of journaled adds: as journaled, or read back from the float16 rows (a row deleted since
        reads as zeros: its seq is tombstoned, so it is never returned)."""
        if vecs is not None:
            return _as_f32(vecs)
        if self.vectors is None:
            raise RuntimeError("a journaled add without its vectors and no vector file to read them from")
        return self.vectors.read(seqs)

    # --- state ---------------------------------------------------------------------------------------
    @property
    def count(self) -> int:
        """Live vectors (tombstoned ones excluded)."""
        with self._lock.read():
            return int(self._index.ntotal) - len(self._tomb)

    @property
    def tombstones(self) -> int:
        return len(self._tomb)

    @property
    def nlist(self) -> int | None:
        return int(self._index.nlist) if self.kind in TRAINED else None

    def live_ids(self) -> np.ndarray:
        with self._lock.read():
            if self.kind == "flat":
                ids = faiss.vector_to_array(self._index.id_map).astype(np.int64)
            else:
                inv = self._index.invlists
                chunks = [faiss.rev_swig_ptr(inv.get_ids(i), inv.list_size(i)).copy()
                          for i in range(self._index.nlist) if inv.list_size(i)]
                ids = np.concatenate(chunks).astype(np.int64) if chunks else np.empty(0, np.int64)
            tomb = np.fromiter(self._tomb, dtype=np.int64, count=len(self._tomb))
        return ids[~np.isin(ids, tomb)] if len(tomb) else ids

    # --- mutation ----------------------------------------------------------------------------------
    def add(self, seqs: np.ndarray, vectors: np.ndarray) -> None:
        if vectors.shape[1] != self.dim:
            raise ValueError(f"vectors have dim {vectors.shape[1]}, index has {self.dim}")
        ids, vecs = np.asarray(seqs, dtype=np.int64), _as_f32(vectors)
        with self._lock.write():
            if self.vectors is not None and self.owns_vectors:  # first: a search that finds it can re-rank it
                self.vectors.write(ids, vecs)
            self._index.add_with_ids(vecs, ids)
            if self._mirror is not None:
                self._mirror.add(ids, vecs)
            if self._journal is not None:  # seqs only where the float16 rows hold the vectors (_Journal)
                self._journal.adds.append((ids.copy(), None if self.vectors is not None else vecs.copy()))

    def remove(self, seqs: Iterable[int]) -> None:
        """Invisible to every search that starts after this returns; physically removed by :meth:`compact`."""
        gone = frozenset(int(s) for s in seqs)
        with self._tomb_lock:
            self._tomb = self._tomb | gone
            if self._journal is not None:
                self._journal.removed |= gone
        if self.vectors is not None and self.owns_vectors and gone:  # filtered from here on; the copy goes too
            # not fsynced: a crash leaves no saved index, so the next start rewrites this copy from the database
            # (or removes it, under a configuration without one: startup._drop_unused_copies)
            self.vectors.zero(np.fromiter(gone, dtype=np.int64, count=len(gone)))

    # the in-process side of PoolIndex (t3ar_services.retriever.backend): what a Milvus collection does differently
    persistent = False  # rebuilt from the database when it cannot be trusted; saved at shutdown
    pending = False  # a failed add rebuilds it at once: never left disagreeing

    def settle(self, vectors_of: Callable[[list[int]], dict[int, np.ndarray]]) -> None:
        pass

    def remove_before_commit(self, seqs: list[int]) -> None:
        pass  # tombstoned once the rows are gone (remove_after_commit)

    def remove_after_commit(self, seqs: list[int]) -> None:
        self.remove(seqs)  # tombstoned at once, compacted in the background

    def discard_failed_add(self, seqs: list[int]) -> None:
        self.remove(seqs)

    def compact(self) -> int:
        """Remove tombstoned ids from faiss (an O(N) pass under the write lock). Returns how many."""
        with self._lock.write():
            doomed = self._tomb
            if not doomed:
                return 0
            ids = np.fromiter(doomed, dtype=np.int64, count=len(doomed))
            self._index.remove_ids(ids)
            if self._mirror is not None:
                self._mirror.remove(ids)
            with self._tomb_lock:
                self._tomb = self._tomb - doomed
        return len(doomed)

    # --- search ----------------------------------------------------------------------------------------
    def search(self, queries: np.ndarray, k: int, *, exclude: Iterable[int] = (),
               allowed: np.ndarray | None = None) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Top-``k`` live ids per query by inner product -> (scores per query, seqs per query), each row
        sorted best first and at most ``k`` long (shorter when fewer items qualify). ``allowed``: only
        these ids (e.g. one source). ``exclude``: never these ids."""
        q = _as_f32(queries)
        with self._lock.read():
            drop = self._tomb | frozenset(int(i) for i in exclude)
            ntotal = int(self._index.ntotal)
            if ntotal == 0 or len(q) == 0:
                return [np.empty(0, np.float32)] * len(q), [np.empty(0, np.int64)] * len(q)
            sel: Any = None
            if allowed is not None or len(drop) > SELECTOR_MIN_DROP:
                parts: list[Any] = []
                if allowed is not None:
                    parts.append(faiss.IDSelectorBatch(np.asarray(allowed, dtype=np.int64)))
                if drop:
                    parts.append(faiss.IDSelectorNot(faiss.IDSelectorBatch(
                        np.fromiter(drop, dtype=np.int64, count=len(drop)))))
                sel = parts[0] if len(parts) == 1 else faiss.IDSelectorAnd(parts[0], parts[1])
                kk = min(self._candidates(k), ntotal)
            else:
                kk = min(self._candidates(k) + len(drop), ntotal)
            if self.kind in TRAINED:
                params: Any = F.SearchParametersIVF(nprobe=self.nprobe, sel=sel) if sel is not None \
                    else F.SearchParametersIVF(nprobe=self.nprobe)
            else:
                params = F.SearchParameters(sel=sel) if sel is not None else None
            if self._mirror is not None:  # exact search on the device, same filters
                scores, ids = self._mirror.search(q, kk, allowed=allowed if sel is not None else None,
                                                  drop=drop if sel is not None else frozenset())
            else:
                faiss.omp_set_num_threads(search_threads(len(q), self.threads))  # per calling thread in libgomp
                scores, ids = self._index.search(q, kk, params=params)
        valid = ids >= 0
        if drop and sel is None:
            valid &= ~np.isin(ids, np.fromiter(drop, dtype=np.int64, count=len(drop)))
        if self._reranks:
            assert self.vectors is not None
            scores, ids, valid = _rerank(self.vectors, q, ids, valid, k)
        if valid.all():  # the usual case: every row is k live ids (views of the answer's rows, no copies)
            return list(scores[:, :k]), list(ids[:, :k])
        out_s, out_i = [], []
        for row_s, row_i, row_v in zip(scores, ids, valid, strict=True):
            out_s.append(row_s[row_v][:k])
            out_i.append(row_i[row_v][:k])
        return out_s, out_i

    @property
    def _reranks(self) -> bool:
        return self.kind == "ivfpq" and self.vectors is not None

    def _candidates(self, k: int) -> int:
        """How many results to ask faiss for (before tombstones): ``k``, or the re-ranking's candidates."""
        return max(k * self.rerank, k + RERANK_MIN_EXTRA) if self._reranks else k

    # --- persistence ------------------------------------------------------------------------------------
    def save(self, path: Path, marker: dict[str, Any]) -> None:
        """Write the index and its marker (the DB state it reflects) atomically, index first."""
        self.compact()
        with self._lock.read():
            if self.vectors is not None:  # the rows the saved index re-ranks with, on disk before its marker
                self.vectors.flush()
            tmp = path.with_suffix(".tmp")
            faiss.write_index(self._index, str(tmp))
        fsync_path(tmp)
        os.replace(tmp, path)
        mpath = marker_path(path)
        mtmp = mpath.with_suffix(".tmp")
        mtmp.write_text(json.dumps(marker))
        fsync_path(mtmp)
        os.replace(mtmp, mpath)
        fsync_path(path.parent)

    @classmethod
    def load(cls, path: Path, nprobe: int) -> tuple[VectorIndex, dict[str, Any]] | None:
        mpath = marker_path(path)
        if not path.exists() or not mpath.exists():
            return None
        marker = json.loads(mpath.read_text())
        index: Any = faiss.read_index(str(path))
        if isinstance(index, faiss.IndexIDMap2):
            return cls(index, index.d, "flat"), marker
        if isinstance(index, faiss.IndexIVFPQ):
            kind: IndexKind = "ivfpq"
        elif isinstance(index, faiss.IndexIVFFlat):  # keep the object read_index returned: it owns the memory
            kind = "ivf"
        else:
            raise ValueError(f"{path}: unexpected index type {type(index).__name__}")
        index.nprobe = min(nprobe, index.nlist)
        out = cls(index, index.d, kind, index.nprobe)
        out.trained_on = int(marker.get("trained_on") or index.ntotal)
        return out, marker


def _member(sorted_ids: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``np.isin(ids, sorted_ids)`` in O(len(ids) log n) for an already sorted ``sorted_ids``."""
    if not len(sorted_ids):
        return np.zeros(len(ids), dtype=bool)
    pos = np.searchsorted(sorted_ids, ids).clip(max=len(sorted_ids) - 1)
    return sorted_ids[pos] == ids


def _writing(vf: VectorFile, batches: Iterable[tuple[np.ndarray, np.ndarray]]
             ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``batches``, each written to ``vf`` on its way through."""
    for seqs, vecs in batches:
        vf.write(seqs, vecs)
        yield seqs, vecs


def open_vector_file(dim: int, config: IndexConfig, *, reset: bool) -> VectorFile | None:
    """The configured index's :class:`VectorFile` (ivfpq with a ``vector_file``), emptied when ``reset`` (never
    the store's own file)."""
    if config.kind != "ivfpq" or config.vector_file is None:
        return None
    vf = VectorFile(config.vector_file, dim)
    if reset and not config.vectors_shared:
        vf.reset()
    return vf


def _rerank(vf: VectorFile, q: np.ndarray, ids: np.ndarray, valid: np.ndarray,
            k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Re-score the candidates ``ids`` [n, c] (``valid`` marks the usable ones) by the exact inner product with
    their float16 rows; -> (scores, ids, valid), each [n, <= k], best first."""
    n, c = ids.shape
    kk = min(k, c)
    out_s = np.empty((n, kk), np.float32)
    out_i = np.empty((n, kk), np.int64)
    out_v = np.empty((n, kk), bool)
    for a in range(0, n, RERANK_CHUNK):
        b = min(n, a + RERANK_CHUNK)
        cand = np.where(valid[a:b], ids[a:b], -1)
        rows = vf.read(cand.ravel()).reshape(b - a, c, -1)
        exact = np.einsum("qd,qcd->qc", q[a:b], rows)
        exact[~valid[a:b]] = -np.inf
        order = np.argsort(-exact, axis=1, kind="stable")[:, :kk]
        out_s[a:b] = np.take_along_axis(exact, order, 1)
        out_i[a:b] = np.take_along_axis(cand, order, 1)
        out_v[a:b] = np.take_along_axis(valid[a:b], order, 1)
    return out_s, out_i, out_v


def min_to_train(config: IndexConfig) -> int:
    """The fewest vectors this kind can be trained on (ivfpq: one 8-bit codebook of 256 centroids per
    sub-quantiser needs 256 points)."""
    return 256 if config.kind == "ivfpq" else 1


def new_trained(dim: int, config: IndexConfig, nlist: int, sample: np.ndarray) -> Any:
    """An empty index of the configured trained kind (ivf or ivfpq), trained on ``sample``."""
    if config.kind == "ivfpq":
        return new_ivfpq(dim, nlist, config.pq_m, sample)
    return new_ivf(dim, nlist, sample)


def new_ivfpq(dim: int, nlist: int, m: int, sample: np.ndarray) -> Any:
    """An empty ``IndexIVFPQ`` (inner product, ``m`` 8-bit sub-quantisers, own ids, removal supported)."""
    if dim % m:
        raise ValueError(f"pq_m={m} must divide the vectors' dimension {dim}")
    quantizer: Any = faiss.IndexFlatIP(dim)
    ivf: Any = faiss.IndexIVFPQ(quantizer, dim, nlist, m, 8, faiss.METRIC_INNER_PRODUCT)
    ivf.own_fields = True
    quantizer.this.disown()
    ivf.train(_as_f32(sample))
    return ivf


def new_ivf(dim: int, nlist: int, sample: np.ndarray) -> Any:
    """An empty ``IndexIVFFlat`` (inner product, own ids, removal supported) trained on ``sample``."""
    quantizer: Any = faiss.IndexFlatIP(dim)
    ivf: Any = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
    ivf.own_fields = True  # the IVF index frees its quantizer; Python must not (it would dangle)
    quantizer.this.disown()
    ivf.train(_as_f32(sample))
    return ivf


def marker_path(index_path: Path) -> Path:
    return index_path.with_name(index_path.name + ".marker.json")

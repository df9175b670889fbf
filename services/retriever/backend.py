"""Pool backends: where the pool's vector index lives. ``faiss`` (the embedded default: the in-process
:class:`~t3ar_services.retriever.index.VectorIndex`, saved on clean shutdown) or ``milvus`` (a Milvus
collection through pymilvus' ``MilvusClient``: Milvus standalone / cluster by URI + token in production, or
milvus-lite embedded in a local file, the default, for tests and ``t3ar up``).

Where the pool lives with either backend (one design, so every guarantee holds the same way):
- SQLite (``pool.sqlite3``) stays the source of truth for ids, sha256, source, metadata and the vectors;
- the blob store (``blobs/``) stays a file store of the image bytes;
- the backend holds the derived, searchable copy of (id, vector). Milvus' collection has two fields,
  ``seq`` (INT64 primary key = the pool id's number) and ``vector`` (FLOAT_VECTOR, inner product, indexed by
  :class:`MilvusConfig`: HNSW by default, IVF_FLAT or FLAT by configuration; a collection whose index differs
  from the configured one is re-indexed at start-up). Source filters and ``exclude_ids`` become a
  ``seq in [...]`` / ``seq not in [...]`` filter expression.

So switching or migrating backends never re-embeds (the vectors are in SQLite), the start-up check compares
the backend's ids with the database's and repairs any difference (an add or delete interrupted by a crash),
and ``t3ar pool migrate`` is that same synchronisation run ahead of time (both in
:mod:`~t3ar_services.retriever.milvus_sync`).

Deletion on Milvus: the vectors are deleted in Milvus first (the DELETE is not acknowledged before Milvus
acknowledged it), then the row (and then the blob). Searches read at the configured consistency level (``Session``
by default: a search waits only until Milvus applied this client's last write, not for the server's newest timestamp
as ``Strong`` does; at ``Bounded`` it may still see a delete of the last few seconds as not done, and so may any
level after a restart of the retriever or of Milvus), and the guarantee that a deleted id never comes back after its
2xx is the retriever's own: every Milvus answer is filtered against the database, where the deleted row is gone
(durably, ``synchronous=FULL``) before the 2xx (:meth:`MilvusIndex.search`; ``Store.present``). The database is that
record of deletions: it survives any restart and never grows with deletes (a deleted id is an absent row, and ids
are never reused). To return k results when some of Milvus' top k are filtered out, a search asks Milvus for k plus
the number of ids deleted in the last minute (at most 2k), and asks again for more (doubling) for the queries that
still come up short while Milvus had more to give.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from t3ar_services.retriever.errors import NotReadyError

log = logging.getLogger(__name__)

Backend = Literal["faiss", "milvus"]
BACKENDS: tuple[Backend, ...] = ("faiss", "milvus")
_INSERT_BATCH = 8192  # rows per Milvus insert (8192 x 512-d float32 = 16 MiB, under gRPC's 64 MiB message)
_MAX_TOPK = 16384  # Milvus' limit on k per search
# milvus-lite searches rows that are not flushed yet by a slow pure-Python scan (3.6 s per query at 20k
# unflushed 512-d rows, 0.06 s once flushed, measured here): it is flushed once this many rows wait. A Milvus
# server searches growing segments natively and seals them itself, so it is never flushed from here.
LITE_FLUSH_ROWS = 2048
RECENT_DELETES_S = 60.0  # deletes this recent size a search's over-fetch (Bounded staleness is seconds)

MilvusIndexType = Literal["HNSW", "IVF_FLAT", "FLAT"]
Consistency = Literal["Bounded", "Session", "Strong"]


@dataclass(frozen=True)
class MilvusConfig:
    """How the collection is indexed and read (``T3AR_RETRIEVER_MILVUS_*``; docs/configuration.md).

    ``HNSW`` (``M`` links per node, ``efConstruction`` at build, ``ef`` per search, at least k) or ``IVF_FLAT``
    (``nlist`` lists, ``nprobe`` probed per search) or ``FLAT`` (exact). Milvus builds the index itself, per
    sealed segment; both milvus-lite (3.x, with faiss) and a Milvus server support all three. ``consistency``:
    the level every search reads at. ``Strong`` waits for the server's newest timestamp on every search;
    ``Session`` (the default) only for this client's last write (pymilvus keeps its timestamp), so the
    retriever, the collection's one writer, searches its own adds and deletes at once and waits for nothing
    when no write is recent; ``Bounded`` (Milvus' default) never waits and may miss the last seconds' writes.
    The deletion guarantee does not depend on it (:meth:`MilvusIndex.search`)."""

    index: MilvusIndexType = "HNSW"
    hnsw_m: int = 16
    hnsw_ef_construction: int = 200
    hnsw_ef: int = 128
    ivf_nlist: int = 1024
    ivf_nprobe: int = 32
    consistency: Consistency = "Session"

    def build_params(self) -> dict[str, int]:
        if self.index == "HNSW":
            return {"M": self.hnsw_m, "efConstruction": self.hnsw_ef_construction}
        if self.index == "IVF_FLAT":
            return {"nlist": self.ivf_nlist}
        return {}

    def search_params(self, limit: int) -> dict[str, Any]:
        if self.index == "HNSW":
            return {"metric_type": "IP", "params": {"ef": max(self.hnsw_ef, limit)}}  # Milvus wants ef >= k
        if self.index == "IVF_FLAT":
            return {"metric_type": "IP", "params": {"nprobe": self.ivf_nprobe}}
        return {"metric_type": "IP"}


class PoolIndex(Protocol):
    """What the pool needs of its vector index (:class:`VectorIndex` and :class:`MilvusIndex` both are one)."""

    @property
    def kind(self) -> str: ...
    @property
    def nprobe(self) -> int: ...
    @property
    def count(self) -> int: ...
    @property
    def tombstones(self) -> int: ...
    @property
    def nlist(self) -> int | None: ...
    @property
    def device(self) -> str | None: ...
    @property
    def trained_on(self) -> int | None: ...
    def live_ids(self) -> np.ndarray: ...
    def add(self, seqs: np.ndarray, vectors: np.ndarray) -> None: ...
    def remove(self, seqs: Iterable[int]) -> None: ...
    def compact(self) -> int: ...

    # what differs between an in-process index (faiss) and one kept outside the process (Milvus)
    @property
    def persistent(self) -> bool:
        """Kept outside this process across restarts: a failed add is undone in the database (the index cannot be
        rebuilt from it in passing) and nothing is saved at shutdown."""
        ...
    @property
    def pending(self) -> bool:
        """A failed write left the index possibly disagreeing with the database: :meth:`settle` is due."""
        ...
    def settle(self, vectors_of: Callable[[list[int]], dict[int, np.ndarray]]) -> None:
        """Make the index agree again after failed writes (the caller holds the pool's writer lock)."""
        ...
    def remove_before_commit(self, seqs: list[int]) -> None:
        """A delete's first step, before the rows' deletion is committed: an index outside the process removes
        them here (NotReadyError when unacknowledged: the rows stay)."""
        ...
    def remove_after_commit(self, seqs: list[int]) -> None:
        """A delete's last step, once the rows are gone: an in-process index tombstones them here."""
        ...
    def discard_failed_add(self, seqs: list[int]) -> None:
        """After an add failed and its rows were deleted: no search may return them; never raises."""
        ...
    def search(self, queries: np.ndarray, k: int, *, exclude: Iterable[int] = (),
               allowed: np.ndarray | None = None) -> tuple[list[np.ndarray], list[np.ndarray]]:
        ...


class MilvusUnavailableError(RuntimeError):
    """pymilvus is not installed, or the Milvus server cannot be reached / answers with an error."""


def _pymilvus() -> Any:
    try:
        import pymilvus
    except ImportError as e:
        raise MilvusUnavailableError(
            "the milvus pool backend needs pymilvus (and milvus-lite for a local file URI): "
            "pip install 't3ar[milvus]' (also in 't3ar[all]'), or use T3AR_RETRIEVER_BACKEND=faiss") from e
    return pymilvus


def default_collection(tag: str) -> str:
    """One collection per pool: the pool tag is random per pool, so two pools never share a collection."""
    return f"t3ar_pool_{tag}"


def connect(uri: str, token: str | None, timeout: float = 10.0) -> Any:
    """A MilvusClient, or MilvusUnavailableError saying which URI failed and why. A URI that is a local path
    (no ``scheme://``) opens milvus-lite on that file (its directory is created)."""
    pm = _pymilvus()
    if local_file(uri):
        Path(uri).parent.mkdir(parents=True, exist_ok=True)
    try:
        client = pm.MilvusClient(uri=uri, token=token or "", timeout=timeout)
        client.list_collections()  # a round trip: fails here, at start-up, when the server is not there
    except Exception as e:
        where = "milvus-lite file" if local_file(uri) else "Milvus server"
        if local_file(uri):
            release_local(uri)
        raise MilvusUnavailableError(f"cannot use the {where} at {uri!r} (T3AR_RETRIEVER_MILVUS_URI): "
                                     f"{type(e).__name__}: {e}") from e
    return client


Present = Callable[[np.ndarray], np.ndarray]  # ids -> a bool per id: does the pool still hold it


class MilvusIndex:
    """The pool's vectors in one Milvus collection (``seq`` INT64 primary key, ``vector`` FLOAT_VECTOR, IP).

    ``present``: the pool's record of which ids exist (``Store.present``); every search answer is filtered by
    it, so a deleted id is never returned whatever the consistency level. Without it (tools that only copy
    vectors, such as ``t3ar pool migrate``) answers are Milvus' own."""

    kind = "milvus"
    nprobe = 0
    tombstones = 0
    nlist = None
    device = None
    trained_on = None

    def __init__(self, client: Any, collection: str, dim: int, local_file: str | None = None, *,
                 config: MilvusConfig | None = None, present: Present | None = None) -> None:
        self.client, self.collection, self.dim = client, collection, dim
        self.config = config or MilvusConfig()
        self.present = present
        self._deleted: deque[tuple[float, int]] = deque()  # (monotonic time, ids deleted): sizes the over-fetch
        self.filtered = 0  # results dropped because their row was gone (Milvus had not applied the delete yet)
        self.stale_reads = 0  # queries asked again at Strong: the read had not caught up (after a Milvus restart)
        self.local_file = local_file  # milvus-lite: its in-process server is stopped (and the file unlocked) at close
        self.flush_rows = LITE_FLUSH_ROWS if local_file else 0
        self._unflushed = 0
        self._count_lock = threading.Lock()
        self.failed = False  # a call failed while serving: the collection may disagree, check at next start
        # ids of a failed add that may have reached Milvus and could not be deleted there at once: no search
        # returns them (excluded), and the pool's next settle deletes them (else the next start-up check does)
        self._ghosts: set[int] = set()
        # ids of a failed delete (not acknowledged: the rows stay) that may have reached Milvus: the pool's next
        # settle puts back the vectors of those still in the pool
        self._restore: set[int] = set()
        pm = _pymilvus()
        self._call(self._ensure_collection, pm)
        self._count = self._query_count()

    # --- set-up ------------------------------------------------------------------------------------
    def _ensure_collection(self, pm: Any) -> None:
        c = self.client
        if c.has_collection(self.collection):
            fields = {f["name"]: f for f in c.describe_collection(self.collection)["fields"]}
            vec = fields.get("vector")
            have = int(vec["params"].get("dim", -1)) if vec else None
            if "seq" not in fields or have != self.dim:
                raise MilvusUnavailableError(
                    f"Milvus collection {self.collection!r} exists but is not a {self.dim}-d t3ar pool "
                    f"(fields {sorted(fields)}, vector dim {have}); set T3AR_RETRIEVER_MILVUS_COLLECTION to "
                    "another name")
            self._ensure_index()
            c.load_collection(self.collection)
            return
        schema = pm.MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("seq", pm.DataType.INT64, is_primary=True)
        schema.add_field("vector", pm.DataType.FLOAT_VECTOR, dim=self.dim)
        c.create_collection(self.collection, schema=schema, index_params=self._index_params(),
                            consistency_level=self.config.consistency)
        log.info("created Milvus collection %s (%d-d, %s %s, inner product)", self.collection, self.dim,
                 self.config.index, self.config.build_params())

    def _index_params(self) -> Any:
        params = self.client.prepare_index_params()
        params.add_index(field_name="vector", index_type=self.config.index, metric_type="IP",
                         params=self.config.build_params())
        return params

    def _ensure_index(self) -> None:
        """Re-index an existing collection whose vector index is not the configured one (type, or build
        parameters where Milvus reports them): released, its index dropped and created again (then loaded)."""
        c = self.client
        names = c.list_indexes(self.collection, field_name="vector")
        have = c.describe_index(self.collection, names[0]) if names else {}
        want = self.config.build_params()
        if have.get("index_type") == self.config.index and all(
                str(have[k]) == str(v) for k, v in want.items() if k in have):
            return
        log.warning("Milvus collection %s is indexed %s %s, configured %s %s: re-indexing it", self.collection,
                    have.get("index_type"), {k: have[k] for k in want if k in have}, self.config.index, want)
        c.release_collection(self.collection)
        if names:
            c.drop_index(self.collection, names[0])
        c.create_index(self.collection, self._index_params())

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except MilvusUnavailableError:
            raise
        except Exception as e:  # a server error or a lost connection: the pool answers 503, retry later
            self.failed = True
            raise NotReadyError(f"the Milvus backend failed ({type(e).__name__}: {e}); retry in a moment") from e

    def _query_count(self) -> int:
        rows = self._call(self.client.query, self.collection, filter="", output_fields=["count(*)"],
                          consistency_level="Strong")
        return int(rows[0]["count(*)"])

    # --- state ----------------------------------------------------------------------------------------
    @property
    def count(self) -> int:
        return self._count

    def iter_ids(self, batch: int = 16384) -> Iterator[np.ndarray]:
        it = self._call(self.client.query_iterator, self.collection, batch_size=batch, filter="",
                        output_fields=["seq"], consistency_level="Strong")
        try:
            while rows := self._call(it.next):
                yield np.fromiter((r["seq"] for r in rows), dtype=np.int64, count=len(rows))
        finally:
            it.close()

    def live_ids(self) -> np.ndarray:
        parts = list(self.iter_ids())
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def vectors(self, seqs: np.ndarray) -> np.ndarray:
        """Stored vectors of these ids, in this order (for checks and migration)."""
        rows = self._call(self.client.query, self.collection, ids=[int(s) for s in seqs],
                          output_fields=["seq", "vector"], consistency_level="Strong")
        by = {int(r["seq"]): r["vector"] for r in rows}
        return np.asarray([by[int(s)] for s in seqs], dtype=np.float32).reshape(len(seqs), self.dim)

    # --- mutation ------------------------------------------------------------------------------------
    @property
    def ghosts(self) -> int:
        return len(self._ghosts)

    @property
    def pending(self) -> bool:
        """A failed write left the collection possibly disagreeing with the pool: :meth:`settle` is due."""
        return bool(self._ghosts or self._restore)

    def forget(self, seqs: Iterable[int]) -> None:
        """Ids whose rows are gone but whose vectors may still be in Milvus (a failed add whose withdrawal failed
        too): excluded from every search from now on, deleted at the next :meth:`settle`."""
        with self._count_lock:
            self._ghosts.update(int(s) for s in seqs)

    def restore_later(self, seqs: Iterable[int]) -> None:
        """Ids whose rows stay but whose vectors a failed delete may have removed from Milvus: put back (upsert)
        at the next :meth:`settle`, unless deleted meanwhile."""
        with self._count_lock:
            self._restore.update(int(s) for s in seqs)

    def settle(self, vectors_of: Callable[[list[int]], dict[int, np.ndarray]]) -> None:
        """Make the collection agree again after failed writes: delete the ghosts, upsert the vectors of the ids a
        failed delete may have removed (``vectors_of`` gives those still in the pool). The caller holds the pool's
        writer lock (no delete or add runs meanwhile). NotReadyError while Milvus is still down: retried later."""
        with self._count_lock:
            ghosts, restore = sorted(self._ghosts), sorted(self._restore)
        if ghosts:
            self._call(self.client.delete, self.collection, ids=ghosts)  # deleting an absent id is a no-op
        back = list(vectors_of(restore).items()) if restore else []
        for start in range(0, len(back), _INSERT_BATCH):
            rows = [{"seq": s, "vector": v} for s, v in back[start:start + _INSERT_BATCH]]
            self._call(self.client.upsert, self.collection, rows)
        with self._count_lock:
            self._ghosts.difference_update(ghosts)
            self._restore.difference_update(restore)
        self.resync_count()
        log.info("Milvus settled after failed writes: %d stray vectors deleted, %d vectors put back",
                 len(ghosts), len(back))

    def add(self, seqs: np.ndarray, vectors: np.ndarray) -> None:
        if vectors.shape[1] != self.dim:
            raise ValueError(f"vectors have dim {vectors.shape[1]}, index has {self.dim}")
        seqs = np.asarray(seqs, dtype=np.int64)
        vecs = np.ascontiguousarray(vectors, dtype=np.float32)
        for start in range(0, len(seqs), _INSERT_BATCH):
            rows = [{"seq": int(s), "vector": v} for s, v in
                    zip(seqs[start:start + _INSERT_BATCH].tolist(), vecs[start:start + _INSERT_BATCH], strict=True)]
            self._call(self.client.insert, self.collection, rows)
            with self._count_lock:
                self._count += len(rows)
            self._unflushed += len(rows)
            if self.flush_rows and self._unflushed >= self.flush_rows:
                self.flush()

    def flush(self) -> None:
        """Seal what was inserted (milvus-lite: so that it is searched by the fast path)."""
        self._call(self.client.flush, self.collection)
        self._unflushed = 0

    def remove(self, seqs: Iterable[int]) -> None:
        """Deleted in Milvus (acknowledged by it on return). A search at Bounded consistency may see them for a
        few seconds more; the pool's rows going next is what keeps them out of every answer (:meth:`search`)."""
        ids = [int(s) for s in seqs]
        with self._count_lock:  # deleted now: nothing to put back
            self._restore.difference_update(ids)
            self._deleted.append((time.monotonic(), len(ids)))
        for start in range(0, len(ids), _INSERT_BATCH):
            chunk = ids[start:start + _INSERT_BATCH]
            self._call(self.client.delete, self.collection, ids=chunk)
            with self._count_lock:
                self._count -= len(chunk)

    def recent_deletes(self) -> int:
        """Ids deleted in the last :data:`RECENT_DELETES_S` seconds (Milvus may still return them at Bounded)."""
        cutoff = time.monotonic() - RECENT_DELETES_S
        with self._count_lock:
            while self._deleted and self._deleted[0][0] < cutoff:
                self._deleted.popleft()
            return sum(n for _, n in self._deleted)

    def compact(self) -> int:
        return 0  # Milvus compacts its segments itself

    persistent = True

    def remove_before_commit(self, seqs: list[int]) -> None:
        """Deleted in Milvus before the rows' deletion is committed; if the call is not acknowledged the
        rows stay and, should the delete have reached Milvus without its answer, their vectors are put back at the
        next :meth:`settle`."""
        try:
            self.remove(seqs)
        except NotReadyError:
            self.restore_later(seqs)
            raise

    def remove_after_commit(self, seqs: list[int]) -> None:
        pass  # removed before the commit

    def discard_failed_add(self, seqs: list[int]) -> None:
        try:  # a batch that did reach Milvus must not stay searchable
            self.remove(seqs)
            self.resync_count()
        except Exception:  # never searchable meanwhile: excluded, deleted by the next write
            self.forget(seqs)
            log.warning("could not withdraw a failed add of %d vectors from Milvus: they are excluded from every "
                        "search and the next write (or the next start-up check) deletes them", len(seqs))

    def resync_count(self) -> None:
        with self._count_lock:
            self._count = self._query_count()

    # --- search ------------------------------------------------------------------------------------------
    def search(self, queries: np.ndarray, k: int, *, exclude: Iterable[int] = (),
               allowed: np.ndarray | None = None) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Same contract as :meth:`VectorIndex.search`: per query (scores, seqs), best first, at most k
        Every answer is filtered
        by ``present`` (ids whose row is gone never come back, whatever Milvus' consistency level showed); Milvus
        is asked for more than k so that k survive, and asked again, for more, for a query that came up short
        while Milvus had more to give."""
        n = len(queries)
        with self._count_lock:
            drop = sorted({int(s) for s in exclude} | self._ghosts)
        parts = []
        if allowed is not None:
            if not len(allowed):
                return [np.empty(0, np.float32) for _ in range(n)], [np.empty(0, np.int64) for _ in range(n)]
            parts.append(f"seq in {np.asarray(allowed, dtype=np.int64).tolist()}")
        if drop:
            parts.append(f"seq not in {drop}")
        expr = " and ".join(parts)
        rows = np.ascontiguousarray(queries, dtype=np.float32)
        want = min(k, _MAX_TOPK)
        limit = min(want + (min(self.recent_deletes(), 2 * want) if self.present is not None else 0), _MAX_TOPK)
        out_s: list[np.ndarray] = [np.empty(0, np.float32)] * n
        out_i: list[np.ndarray] = [np.empty(0, np.int64)] * n
        todo = list(range(n))
        with self._count_lock:  # how many a query must get back at least, where the whole pool is searched
            expected = max(0, self._count - len(drop)) if allowed is None else 0
        level = self.config.consistency
        while todo:
            scores, seqs = self._search_once(rows[todo], limit, expr, level)
            stale = [j for j in range(len(todo)) if len(seqs[j]) < min(limit, expected)]
            if stale and level != "Strong":
                # fewer than the collection holds: a read that has not caught up (a query node that is still
                # replaying its log after a Milvus restart); those queries again at Strong, which waits for it
                again_s, again_i = self._search_once(rows[[todo[j] for j in stale]], limit, expr, "Strong")
                for j, sc, ids in zip(stale, again_s, again_i, strict=True):
                    scores[j], seqs[j] = sc, ids
                with self._count_lock:
                    self.stale_reads += len(stale)
                log.info("milvus: %d of %d queries came back with fewer results than the collection holds; asked "
                         "again at Strong consistency", len(stale), len(todo))
            short = []
            for j, q in enumerate(todo):
                sc, ids = scores[j], seqs[j]
                full = len(ids) == limit  # Milvus may hold more than it gave
                if self.present is not None and len(ids):
                    keep = self.present(ids)
                    if not keep.all():
                        with self._count_lock:
                            self.filtered += int((~keep).sum())
                        sc, ids = sc[keep], ids[keep]
                out_s[q], out_i[q] = sc[:want], ids[:want]
                if len(ids) < want and full and limit < _MAX_TOPK:
                    short.append(q)
            todo, limit = short, min(2 * limit, _MAX_TOPK)
        return out_s, out_i

    def _search_once(self, rows: np.ndarray, limit: int, expr: str,
                     level: Consistency) -> tuple[list[np.ndarray], list[np.ndarray]]:
        res = self._call(self.client.search, self.collection, data=list(rows), limit=limit, filter=expr,
                         output_fields=["seq"], search_params=self.config.search_params(limit),
                         consistency_level=level)
        scores = [np.fromiter((h["distance"] for h in row), dtype=np.float32, count=len(row)) for row in res]
        seqs = [np.fromiter((h["seq"] for h in row), dtype=np.int64, count=len(row)) for row in res]
        return scores, seqs

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:
            log.exception("closing the Milvus client failed")
        if self.local_file:
            release_local(self.local_file)


def local_file(uri: str) -> str | None:
    """The milvus-lite file a URI names (a path without ``scheme://``), else None (a Milvus server)."""
    return None if "://" in uri else uri


def release_local(path: str) -> None:
    """Stop milvus-lite's in-process server for this file: flushes it and releases its lock (else only at exit)."""
    try:
        from milvus_lite import server_manager_instance
    except ImportError:
        return
    server_manager_instance.release_server(path)

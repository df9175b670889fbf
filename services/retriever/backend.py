"""Pool backends: where the pool's vector index lives. ``faiss`` (the embedded default: the in-process
:class:`~t3ar_services.retriever.index.VectorIndex`, saved on clean shutdown) or ``milvus`` (a Milvus
collection through pymilvus' ``MilvusClient``: Milvus standalone / cluster by URI + token in production, or
milvus-lite embedded in a local file, the default, for tests and ``t3ar up``).

Where the pool lives with either backend (one design, so every guarantee holds the same way):
- SQLite (``pool.sqlite3``) stays the source of truth for ids, sha256, source, metadata and the vectors;
- the blob store (``blobs/``) stays a file store of the image bytes;
- the backend holds the derived, searchable copy of (id, vector). Milvus' collection has two fields,
  ``seq`` (INT64 primary key = the pool id's number) and ``vector`` (FLOAT_VECTOR, inner product, FLAT).
  Source filters and ``exclude_ids`` become a ``seq in [...]`` / ``seq not in [...]`` filter expression.

So switching or migrating backends never re-embeds (the vectors are in SQLite), the start-up check compares
the backend's ids with the database's and repairs any difference (an add or delete interrupted by a crash),
and ``t3ar pool migrate`` is that same synchronisation run ahead of time (both in
:mod:`~t3ar_services.retriever.milvus_sync`). Deletion on Milvus: the vectors are deleted in Milvus first, then the
row (and then the blob), and every search uses the ``Strong`` consistency level: once DELETE answers 2xx no search
returns the id.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
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
    def scan_cost(self, n_queries: int) -> float: ...
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
               allowed: np.ndarray | None = None, blocking: bool = True) -> tuple[list[np.ndarray], list[np.ndarray]]:
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


class MilvusIndex:
    """The pool's vectors in one Milvus collection (``seq`` INT64 primary key, ``vector`` FLOAT_VECTOR, IP)."""

    kind = "milvus"
    nprobe = 0
    tombstones = 0
    nlist = None
    device = None
    trained_on = None

    def __init__(self, client: Any, collection: str, dim: int, local_file: str | None = None) -> None:
        self.client, self.collection, self.dim = client, collection, dim
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
            c.load_collection(self.collection)
            return
        schema = pm.MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("seq", pm.DataType.INT64, is_primary=True)
        schema.add_field("vector", pm.DataType.FLOAT_VECTOR, dim=self.dim)
        params = c.prepare_index_params()
        params.add_index(field_name="vector", index_type="FLAT", metric_type="IP")
        c.create_collection(self.collection, schema=schema, index_params=params, consistency_level="Strong")
        log.info("created Milvus collection %s (%d-d, FLAT, inner product)", self.collection, self.dim)

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
                        output_fields=["seq"])
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
        """Deleted in Milvus; with Strong consistency no search that starts after this returns them."""
        ids = [int(s) for s in seqs]
        with self._count_lock:  # deleted now: nothing to put back
            self._restore.difference_update(ids)
        for start in range(0, len(ids), _INSERT_BATCH):
            chunk = ids[start:start + _INSERT_BATCH]
            self._call(self.client.delete, self.collection, ids=chunk)
            with self._count_lock:
                self._count -= len(chunk)

    def compact(self) -> int:
        return 0  # Milvus compacts its segments itself

    persistent = True

    def remove_before_commit(self, seqs: list[int]) -> None:
        """Gone from Milvus (Strong) before the rows' deletion is committed; if the call is not acknowledged the
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
    def scan_cost(self, n_queries: int) -> float:
        return float("inf")  # a network call: never run inline on the event loop (fastpath)

    def search(self, queries: np.ndarray, k: int, *, exclude: Iterable[int] = (),
               allowed: np.ndarray | None = None, blocking: bool = True) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Same contract as :meth:`VectorIndex.search`: per query (scores, seqs), best first, at most k
        (``blocking`` is faiss' lock policy; a Milvus search is always a blocking call)."""
        with self._count_lock:
            drop = sorted({int(s) for s in exclude} | self._ghosts)
        parts = []
        if allowed is not None:
            if not len(allowed):
                empty = [np.empty(0, np.float32) for _ in range(len(queries))]
                return empty, [np.empty(0, np.int64) for _ in range(len(queries))]
            parts.append(f"seq in {np.asarray(allowed, dtype=np.int64).tolist()}")
        if drop:
            parts.append(f"seq not in {drop}")
        rows = list(np.ascontiguousarray(queries, dtype=np.float32))
        res = self._call(self.client.search, self.collection, data=rows,
                         limit=min(k, _MAX_TOPK), filter=" and ".join(parts), output_fields=["seq"],
                         search_params={"metric_type": "IP"}, consistency_level="Strong")
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

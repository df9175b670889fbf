"""Opening a pool directory, checking it, repairing it, and closing it cleanly.

Data directory layout: ``pool.sqlite3`` (+ WAL), ``blobs/<sha[0]>/<sha256>``, ``index/faiss.index`` with
``faiss.index.marker.json`` (the DB state the saved index reflects; written at a clean shutdown, read and
removed at the next start-up), ``index/vectors.f16`` (``ivfpq`` only: the float16 rows it re-ranks with, see
:mod:`~t3ar_services.retriever.vecfile`; trusted only together with a saved index whose marker matches, and
checked against the database on a sample), ``tmp/`` (upload spooling; emptied at start-up). Copies of the vectors
that the configuration started does not keep up to date are removed at start-up (:func:`_drop_unused_copies`).

Start-up, in order: the store opened (float16 storage: rows of deleted items that a crash left recorded in
``vectors_to_zero`` are zeroed, see :mod:`~t3ar_services.retriever.store`) -> identity check (refuse a pool built
by another embedder unless re-embedding is enabled) -> [resumable re-embed] -> orphan-blob sweep -> load the saved
index if its marker and its ids agree with the database, else rebuild from the stored vectors (and log why) ->
ready.
"""

from __future__ import annotations

import logging
import secrets
import shutil
import threading
import time
from collections.abc import Callable
from typing import Protocol

import numpy as np

from t3ar_services.retriever.blobs import BlobStore
from t3ar_services.retriever.errors import PoolConflictError, PoolIdentityError
from t3ar_services.retriever.index import IndexConfig, VectorIndex, marker_path, open_vector_file
from t3ar_services.retriever.pool import Pool, PoolInfo
from t3ar_services.retriever.settings import RetrieverSettings
from t3ar_services.retriever.store import Store, id_checksum
from t3ar_services.retriever.training import build_index

log = logging.getLogger(__name__)
VECTOR_FILE = "vectors.f16"
VECTOR_CHECK_SAMPLE = 256  # saved re-ranking rows compared with the database's vectors at start-up
F16_TOLERANCE = 2e-3  # float16 keeps ~3 decimal digits: a unit vector's components round by < 1e-3


def open_pool(settings: RetrieverSettings, identity: str | None, dim: int | None) -> tuple[Pool, bool]:
    """Open (or create) the pool in ``settings.data_dir``. ``identity``/``dim`` are the configured embedder's
    (None for a vectors-only service). Returns (pool, needs_reembed)."""
    root = settings.data_dir
    root.mkdir(parents=True, exist_ok=True)
    (root / "index").mkdir(exist_ok=True)
    shutil.rmtree(root / "tmp", ignore_errors=True)
    (root / "tmp").mkdir()
    store = Store(root / "pool.sqlite3")
    meta = meta_before = store.meta()
    kind = "vectors" if settings.vectors_only else "images"
    if settings.vectors_only:
        identity, dim = settings.vector_identity, settings.vector_dim
    needs_reembed = False
    if "identity" not in meta:
        if identity is None or dim is None:
            store.close()
            raise PoolConflictError(
                f"{root} holds no pool yet: a vectors-only retriever needs T3AR_RETRIEVER_VECTOR_DIM and "
                "T3AR_RETRIEVER_VECTOR_IDENTITY to create one")
        store.set_meta({"identity": identity, "dim": str(dim), "kind": kind, "tag": secrets.token_hex(3),
                        "created_at": str(time.time())})
        log.info("created a new %s pool in %s (embedder %s, dim %d)", kind, root, identity, dim)
        meta = store.meta()
    elif meta["kind"] != kind:
        store.close()
        mode = "vectors-only (T3AR_RETRIEVER_EMBEDDER=none)" if kind == "vectors" else "an image retriever"
        raise PoolIdentityError(
            f"the pool in {root} is a {meta['kind']} pool (embedder {meta['identity']!r}) but this retriever is "
            f"configured as {mode}; point T3AR_RETRIEVER_DATA_DIR at another directory or change "
            "T3AR_RETRIEVER_EMBEDDER")
    elif identity is not None and meta["identity"] != identity:
        if kind == "images" and settings.reembed_on_start:
            needs_reembed = True
            log.warning("pool embedder %r differs from the configured %r: re-embedding every stored image",
                        meta["identity"], identity)
        else:
            store.close()
            raise PoolIdentityError(
                f"the pool in {root} was embedded with {meta['identity']!r} but this retriever is configured "
                f"with {identity!r}. Start it with the embedder settings that built the pool "
                "(T3AR_RETRIEVER_EMBEDDER / _EMBEDDER_WEIGHTS / _EMBEDDER_IMAGE_SIZE), or re-embed the pool with "
                "the configured embedder: set T3AR_RETRIEVER_REEMBED_ON_START=true (or run `t3ar serve retriever "
                "--reembed`); re-embedding is resumable and keeps every id")
    elif kind == "vectors" and dim is not None and int(meta["dim"]) != dim:
        store.close()
        raise PoolIdentityError(f"the pool in {root} holds {meta['dim']}-d vectors, "
                                f"T3AR_RETRIEVER_VECTOR_DIM says {dim}")
    repairs = [f"zeroed the float16 rows of {store.zeroed_at_open} deleted item(s), left recorded by a crash after "
               "their delete's commit"] if store.zeroed_at_open else []
    try:
        repairs += _vector_storage(settings, store, int(meta["dim"]), created="identity" not in meta_before)
    except BaseException:
        store.close()
        raise
    if needs_reembed and store.vectors is not None and dim != int(meta["dim"]):
        store.close()
        raise PoolIdentityError(f"the pool in {root} keeps {meta['dim']}-d vectors in float16 storage; re-embedding "
                                f"to {dim}-d is not supported there: start a new pool for the new embedder")
    info = PoolInfo(
        data_dir=root, identity=identity if needs_reembed and identity else meta["identity"],
        dim=dim if needs_reembed and dim else int(meta["dim"]), kind=kind, tag=meta["tag"],  # type: ignore[arg-type]
        index_config=IndexConfig(settings.index_type, settings.ivf_nlist, settings.ivf_nprobe, settings.search_threads,
                                 device=settings.search_device, train_min=settings.ivf_train_min,
                                 retrain_growth=settings.ivf_retrain_growth, flat_max=settings.ivf_flat_max,
                                 flat_wait_s=settings.ivf_flat_wait_s, pq_m=settings.pq_m,
                                 rerank=settings.rerank_factor,
                                 vector_file=store.vector_path if store.vectors else root / "index" / VECTOR_FILE,
                                 vectors_shared=store.vectors is not None),
        duplicate_threshold=settings.duplicate_threshold, repairs=repairs)
    if settings.index_type == "ivfpq" and info.dim % settings.pq_m:
        store.close()
        raise PoolConflictError(f"T3AR_RETRIEVER_PQ_M={settings.pq_m} must divide the pool's dimension {info.dim} "
                                "(each sub-quantiser codes dim / pq_m components); e.g. 32 or 64 for 512-d")
    repairs += _drop_unused_copies(settings, store, info.index_config)
    return Pool(info, store, BlobStore(root / "blobs")), needs_reembed


def _drop_unused_copies(settings: RetrieverSettings, store: Store, cfg: IndexConfig) -> list[str]:
    """Remove the files holding copies of the pool's vectors that this configuration neither reads nor keeps up
    to date, since no delete would reach them: ``DATA_DIR/vectors.f16`` beside a ``sqlite`` pool (left by a move to
    float16 storage interrupted before its commit, which a retried move starts afresh), ``index/vectors.f16`` unless
    an ``ivfpq`` faiss index keeps its own rows there, and the saved faiss index under the Milvus backend (all three
    are derived: rebuilt from the database if that configuration comes back). Returns the repairs."""
    repairs: list[str] = []
    if store.vectors is None and store.vector_path.exists():
        store.vector_path.unlink()
        repairs.append(f"removed {store.vector_path.name}, left by a move to float16 storage interrupted before its "
                       "commit (the pool's vectors are in SQLite)")
        log.warning("start-up repair: %s", repairs[-1])
    index_dir = settings.data_dir / "index"
    unused = [] if settings.backend == "faiss" and cfg.kind == "ivfpq" and not cfg.vectors_shared \
        else [index_dir / VECTOR_FILE]
    if settings.backend == "milvus":
        unused += [index_dir / "faiss.index", marker_path(index_dir / "faiss.index")]
    for path in unused:
        if path.exists():
            path.unlink()
            log.info("removed %s: this configuration does not keep it up to date", path)
    return repairs


def _vector_storage(settings: RetrieverSettings, store: Store, dim: int, *, created: bool) -> list[str]:
    """Put the pool's vectors where ``T3AR_RETRIEVER_VECTOR_STORAGE`` says: a new pool gets float16 storage when
    asked (``auto``: with the ``ivfpq`` index); an existing ``sqlite`` pool is migrated only when ``float16`` is set
    explicitly (``auto`` keeps every pool as it is); a float16 pool is never moved back. Returns the repairs."""
    want = settings.vector_storage
    if created:
        if want == "float16" or (want == "auto" and settings.index_type == "ivfpq"):
            store.use_float16(dim)
        return []
    if want == "sqlite" and store.vector_storage == "float16":
        raise PoolConflictError(f"the pool in {settings.data_dir} keeps its vectors in float16 storage "
                                f"({store.vector_path.name}); T3AR_RETRIEVER_VECTOR_STORAGE=sqlite cannot move them "
                                "back (set it to auto or float16)")
    if want == "float16" and store.vector_storage == "sqlite":
        t0 = time.monotonic()
        moved = store.move_vectors_to_file(dim)
        msg = f"moved {moved} vectors from SQLite to float16 storage ({store.vector_path.name}) in " \
              f"{time.monotonic() - t0:.1f}s (T3AR_RETRIEVER_VECTOR_STORAGE=float16)"
        log.warning("start-up migration: %s", msg)
        return [msg]
    return []


def reembed(pool: Pool, embed: Callable[[list[bytes], list[str]], np.ndarray], batch: int) -> None:
    """Re-embed every stored image with the configured embedder; resumable (staged per batch)."""
    store, target = pool.store, pool.info.identity
    if store.meta().get("reembed_target") != target:
        store.reembed_reset()
        store.set_meta({"reembed_target": target})
    after, total, done, t0 = store.reembed_done(), store.count(), 0, time.monotonic()
    while todo := store.reembed_todo(after, batch):
        if any(sha is None for _, sha in todo):
            raise PoolConflictError("this pool has vector-only items, which cannot be re-embedded")
        vecs = np.asarray(embed([pool.blobs.read(sha) for _, sha in todo if sha], [str(s) for s, _ in todo]))
        store.reembed_stage([s for s, _ in todo], vecs)
        after, done = todo[-1][0], done + len(todo)
        log.info("re-embedding: %d/%d items (%.0f/s)", done, total, done / max(time.monotonic() - t0, 1e-9))
    store.reembed_finish({"identity": target, "dim": str(pool.info.dim), "reembed_target": ""})
    pool.info.repairs.append(f"re-embedded {done} items with {target}")
    log.info("re-embedding finished: the pool now uses %s", target)


def sweep_orphans(pool: Pool) -> None:
    shas = pool.store.shas()
    removed = pool.blobs.sweep(lambda name: name in shas)
    missing = sum(1 for sha in shas if not pool.blobs.exists(sha))
    if removed:
        msg = f"removed {removed} orphan blob file(s) (writes interrupted before their commit, or deletes " \
              "interrupted before their unlink)"
        pool.info.repairs.append(msg)
        log.warning("start-up repair: %s", msg)
    if missing:
        log.error("%d committed item(s) have no blob file: their images are lost (disk tampering?)", missing)


def load_index(pool: Pool) -> None:
    """Use the saved index when it provably matches the database, else rebuild it from stored vectors."""
    cfg, info = pool.info.index_config, pool.info
    state = pool.store.state()
    reason = None
    try:
        loaded = VectorIndex.load(pool.index_path, cfg.nprobe)
    except Exception as e:  # a truncated or corrupt file: never trusted, rebuilt
        loaded, reason = None, f"saved index unreadable ({type(e).__name__}: {e})"
    if loaded is None:
        reason = reason or "no saved index (first start, or the last run did not shut down cleanly)"
    else:
        index, marker = loaded
        expected = {"generation": state.generation, "identity": info.identity, "dim": info.dim, **cfg.marker()}
        for key, want in expected.items():
            if marker.get(key) != want:
                reason = f"saved index has {key}={marker.get(key)!r}, the database needs {want!r}"
                break
        # an IVF index trained on a smaller pool is retrained in the background (training.IndexTrainer)
        if reason is None:
            ids = index.live_ids()
            if len(ids) != state.count or id_checksum(ids) != state.checksum:
                reason = (f"saved index holds {len(ids)} ids (checksum {id_checksum(ids)}), the database "
                          f"{state.count} (checksum {state.checksum})")
            elif cfg.kind == "ivfpq":
                reason = _attach_vector_file(pool, index, ids)
    if reason is None and loaded is not None:
        pool.index, pool.persisted = loaded[0], True
        pool.index.threads, pool.index.rerank = cfg.threads, cfg.rerank
        pool.index.attach_device(cfg.device)
        # The saved file is a start-up cache only: drop it now, so that no write (a delete in particular)
        # has to remove a multi-GB file before its 2xx. A crash from here on means a rebuild at the next start.
        pool.invalidate_persisted()
        log.info("index loaded from %s: %d vectors (%s)", pool.index_path, state.count, loaded[0].kind)
        return
    t0 = time.monotonic()
    pool.persisted = False
    for p in (pool.index_path, pool.index_path.with_name(pool.index_path.name + ".marker.json")):
        p.unlink(missing_ok=True)
    index = build_index(info.dim, cfg, state.count, lambda: pool.store.iter_vectors(info.dim))
    if index.count != state.count:
        raise RuntimeError(f"rebuilt index has {index.count} vectors, database {state.count}")
    pool.index = index
    msg = f"rebuilt the index from {state.count} stored vectors in {time.monotonic() - t0:.1f}s: {reason}"
    if state.count or loaded is not None:
        pool.info.repairs.append(msg)
        log.warning("start-up repair: %s", msg)
    else:
        log.info("new empty %s index", index.kind)


def _attach_vector_file(pool: Pool, index: VectorIndex, ids: np.ndarray) -> str | None:
    """Give a loaded ivfpq index its float16 rows if the file agrees with the database: room for every id and a
    sample of rows equal to the stored vectors (to float16 precision). Returns why not, or None."""
    vf = open_vector_file(pool.info.dim, pool.info.index_config, reset=False)
    if vf is None:
        return "no vector file configured"
    if len(ids) and vf.rows <= int(ids.max()):
        vf.close()
        return f"the re-ranking vector file holds {vf.rows} rows, the largest id is {int(ids.max())}"
    rng = np.random.default_rng()
    sample = rng.choice(ids, size=min(VECTOR_CHECK_SAMPLE, len(ids)), replace=False) if len(ids) else ids
    rows = vf.read(sample)
    for seq, row in zip(sample.tolist(), rows, strict=True):
        want = pool.store.vector(seq)
        if want is None or np.abs(row - want).max() > F16_TOLERANCE:
            vf.close()
            return f"the re-ranking vector file disagrees with the database at id {seq}"
    index.vectors, index.owns_vectors = vf, not pool.info.index_config.vectors_shared
    return None


def save_index(pool: Pool) -> None:
    """On clean shutdown: persist the index with the DB state it reflects, for a fast next start."""
    if not isinstance(pool.index, VectorIndex) or pool.persisted:  # FaissBackend's own step: faiss in process
        return
    state = pool.store.state()
    cfg = pool.info.index_config
    marker = {"generation": state.generation, "count": state.count, "checksum": state.checksum,
              "identity": pool.info.identity, "dim": pool.info.dim, **cfg.marker(),
              "trained_on": pool.index.trained_on, "saved_at": time.time()}
    t0 = time.monotonic()
    pool.index.save(pool.index_path, marker)
    pool.persisted = True
    log.info("index saved (%d vectors) in %.1fs", state.count, time.monotonic() - t0)


class Compactor(threading.Thread):
    """Physically removes tombstoned ids from faiss when many accumulated or deletes went quiet."""

    def __init__(self, pool: Pool, threshold: int, idle_seconds: float) -> None:
        super().__init__(name="index-compactor", daemon=True)
        self.pool, self.threshold, self.idle = pool, threshold, idle_seconds
        self.stop_event = threading.Event()
        self.compactions = 0

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.pool.compact_wanted.wait(timeout=max(self.idle, 0.05))
            self.pool.compact_wanted.clear()
            index = self.pool.index
            if index is None or not index.tombstones:
                continue
            quiet = time.monotonic() - self.pool.last_delete >= self.idle
            if index.tombstones >= self.threshold or quiet:
                try:
                    n = index.compact()
                    self.compactions += 1
                    log.debug("compacted %d tombstoned ids out of the index", n)
                except Exception:
                    log.exception("index compaction failed (searches still filter the tombstones)")

    def stop(self) -> None:
        self.stop_event.set()
        self.pool.compact_wanted.set()
        self.join(timeout=30)


class PoolBackend(Protocol):
    """A backend's life in the service (the index itself is a :class:`~t3ar_services.retriever.backend.PoolIndex`):
    ``load`` puts the pool's index in place (in the background loader), ``close`` ends it at shutdown
    (``loaded``: the index was loaded and serving)."""

    @property
    def trains(self) -> bool: ...  # an IVF index is trained in the background as the pool grows
    def load(self, pool: Pool, reembedded: bool) -> None: ...
    def close(self, pool: Pool, loaded: bool) -> None: ...


class FaissBackend:
    """faiss in process: loaded from its saved file when that agrees with the database (else rebuilt), saved
    at a clean shutdown."""

    trains = True

    def load(self, pool: Pool, reembedded: bool) -> None:
        load_index(pool)

    def close(self, pool: Pool, loaded: bool) -> None:
        if loaded:
            try:
                save_index(pool)
            except Exception:
                log.exception("could not save the index; the next start rebuilds it from the database")


def open_backend(settings: RetrieverSettings, pool: Pool) -> PoolBackend:
    """The configured backend; for Milvus the start-up check (no pymilvus, or no Milvus: refuse to start)."""
    if settings.backend != "milvus":
        return FaissBackend()
    from t3ar_services.retriever.backend import MilvusIndex, connect, default_collection, local_file
    from t3ar_services.retriever.milvus_sync import MilvusBackend

    client = connect(settings.milvus_target, settings.milvus_token, settings.milvus_timeout)
    index = MilvusIndex(client, settings.milvus_collection or default_collection(pool.info.tag), pool.info.dim,
                        local_file(settings.milvus_target), config=settings.milvus_config,
                        present=pool.store.present)
    return MilvusBackend(index, settings.milvus_target)

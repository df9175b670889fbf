"""The retriever app: ``create_app()`` (a factory: ``uvicorn --factory t3ar_services.retriever.main:create_app``).

Start-up (lifespan): the data directory's lock (another live process serving it: refuse, naming its pid) ->
settings -> embedder (unless vectors-only) -> open the pool and check its embedder
identity (refuse a mismatch: the process exits with the reason) -> serve; the index is loaded or rebuilt in a
background thread, ``/ready`` answers 503 and pool routes 503 ``not_ready`` until it is done.
Shutdown: stop compaction, save the index with its DB-state marker, close the store.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.types import Scope

from t3ar_services.common.app import create_service_app
from t3ar_services.common.dirlock import data_dir_lifespan
from t3ar_services.common.private import keep_private
from t3ar_services.retriever.deps import RetrieverState
from t3ar_services.retriever.errors import install_error_handlers
from t3ar_services.retriever.index import VectorIndex
from t3ar_services.retriever.metrics import RetrieverMetrics
from t3ar_services.retriever.openapi import install as install_pool_openapi
from t3ar_services.retriever.routes import router
from t3ar_services.retriever.routes_curation import router as curation_router
from t3ar_services.retriever.settings import RetrieverSettings
from t3ar_services.retriever.startup import Compactor, open_backend, open_pool, reembed, sweep_orphans
from t3ar_services.retriever.training import IndexTrainer

log = logging.getLogger(__name__)


def _prepare(state: RetrieverState, needs_reembed: bool, compactor: Compactor, trainer: IndexTrainer) -> None:
    """Background start-up work; the service is ready when this finishes."""
    pool = state.pool
    assert pool is not None
    try:
        if needs_reembed:
            assert state.ingestor is not None
            reembed(pool, state.ingestor.embed_bytes, state.settings.embed_batch_size * 4)
        sweep_orphans(pool)
        assert state.backend is not None
        state.backend.load(pool, needs_reembed)
        state.metrics.repairs.inc(len(pool.info.repairs))
        compactor.start()
        if pool.info.index_config.trained and state.backend.trains:
            trainer.start()
            pool.trainer = trainer  # adds over the flat cap now wait for its first swap (Pool.hold_while_flat)
            trainer.wanted.set()  # a pool that grew past the training threshold since the index was built
        log.info("retriever ready: %d items, %s index, embedder %s", pool.store.count(),
                 pool.index.kind if pool.index else "?", pool.info.identity)
    except Exception as e:
        state.load_error = f"{type(e).__name__}: {e}"
        log.exception("the pool failed to load; the service stays not-ready")


def _search_limit(state: RetrieverState, scope: Scope) -> tuple[int, str] | None:
    """``POST /search``'s own body limit: what a search of this pool can use (refused before it is read)."""
    if scope.get("path") != "/search" or scope.get("method") != "POST":
        return None
    return state.search_body_limit(), (
        ": the most a search of this pool can use (T3AR_RETRIEVER_MAX_QUERIES vectors of the pool's dimension, "
        "T3AR_RETRIEVER_MAX_SEARCH_IMAGE_BYTES of query images, 100,000 exclude_ids); send fewer queries per "
        "request")


def create_app(settings: RetrieverSettings | None = None) -> FastAPI:
    settings = settings if settings is not None else RetrieverSettings()
    keep_private(settings.data_dir)  # the pool's database, blobs and index files 0600
    state = RetrieverState(settings=settings, metrics=RetrieverMetrics())

    @asynccontextmanager
    async def _serving(app: FastAPI) -> AsyncIterator[None]:
        identity = dim = None
        if not settings.vectors_only:
            from t3ar.device import resolve_device
            from t3ar.embedder import Embedder, EmbedderSpec
            from t3ar_services.retriever.ingest import ImageIngestor

            spec = EmbedderSpec.parse(settings.embedder, weights_path=settings.embedder_weights,
                                      pretrained_tag=settings.embedder_pretrained_tag,
                                      image_size=settings.embedder_image_size)
            embedder = Embedder(spec, resolve_device(settings.device))
            state.ingestor = ImageIngestor(embedder, max_pixels=settings.max_image_pixels,
                                           batch_size=settings.embed_batch_size)
            identity, dim = embedder.identity, embedder.dim
        if settings.search_device is not None:  # exact search on a torch device: a clear error now if it is absent
            from t3ar.device import resolve_device

            resolve_device(settings.search_device)
        try:
            pool, needs_reembed = open_pool(settings, identity, dim)
        except Exception as e:
            log.error("retriever cannot start: %s", e)
            raise
        state.pool = pool
        pool.info.backend = settings.backend
        try:  # the start-up check of a Milvus backend: no pymilvus or no Milvus -> refuse to start
            backend = state.backend = open_backend(settings, pool)
        except Exception as e:
            log.error("retriever cannot start: %s", e)
            pool.blobs.close()
            pool.store.close()
            raise
        state.metrics.bind_pool(lambda: float(pool.store.count()),
                                lambda: float(pool.index.count) if pool.index is not None else 0.0)
        compactor = Compactor(pool, settings.compact_threshold, settings.compact_idle_seconds)
        trainer = IndexTrainer(lambda: pool.index if isinstance(pool.index, VectorIndex) else None,
                               pool.info.index_config,
                               lambda: pool.store.iter_vectors(pool.info.dim), wanted=pool.index_grew)
        state.trainer = trainer
        state.loader = threading.Thread(target=_prepare, args=(state, needs_reembed, compactor, trainer),
                                        name="pool-loader", daemon=True)
        state.loader.start()
        try:
            yield
        finally:
            state.loader.join(timeout=600)
            if trainer.is_alive():
                trainer.stop()  # before the save: a build in progress is abandoned, the live index is saved
            if compactor.is_alive():
                compactor.stop()
            backend.close(pool, loaded=pool.index is not None and not state.load_error)
            pool.blobs.close()
            pool.store.close()
            log.info("retriever stopped")

    # one serving process per pool directory: a second one would not see the first's deletes
    lifespan = data_dir_lifespan(settings.data_dir, "this retriever (T3AR_RETRIEVER_DATA_DIR)", settings.auth_disabled,
                                 "add, search and delete", _serving, log)
    app = create_service_app(
        title="t3ar retriever", lifespan=lifespan,
        description="The auxiliary pool: durable, reversible embedding index (add / search / get / delete).",
        form_limits={"max_files": settings.max_items_per_request, "max_fields": 64, "max_part_size": 1 << 20},
        settings=settings, install_errors=install_error_handlers, metrics=state.metrics,
        body_limit=settings.max_upload_bytes,
        body_hint=" (T3AR_RETRIEVER_MAX_UPLOAD_BYTES); send fewer or smaller files per request",
        routers=[router, curation_router], limit_for=lambda scope: _search_limit(state, scope))
    app.state.retriever = state
    install_pool_openapi(app, lambda: None if state.pool is None else {
        "tag": state.pool.info.tag, "dim": state.pool.info.dim, "max_k": settings.max_k,
        "max_queries": settings.max_queries, "max_vectors": settings.max_vectors_per_request})
    return app

"""Dependencies: the service state on ``app.state.retriever`` and bearer-token auth.

They are ``async def`` on purpose: they never block, and FastAPI would run each sync dependency in the thread
pool (a thread hop per dependency per request, which costs milliseconds on a busy machine).

Scopes: the read/write token (``T3AR_RETRIEVER_TOKEN``) may add, search, embed and read; the admin token
(``T3AR_RETRIEVER_ADMIN_TOKEN``) may do all that and delete. No or unknown token -> 401, read/write token on
an admin route -> 403. ``/health``, ``/ready`` and ``/metrics`` need no token.
A request with a body and no known token is refused earlier, before its body is read
(:mod:`t3ar_services.common.credentials`). The check itself: :mod:`t3ar_services.common.auth`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from t3ar_services.common.auth import require, route_scope
from t3ar_services.retriever.errors import NotReadyError, PoolConflictError
from t3ar_services.retriever.metrics import RetrieverMetrics
from t3ar_services.retriever.pool import Pool
from t3ar_services.retriever.settings import RetrieverSettings

if TYPE_CHECKING:
    from t3ar_services.retriever.ingest import ImageIngestor
    from t3ar_services.retriever.startup import PoolBackend
    from t3ar_services.retriever.training import IndexTrainer


@dataclass
class RetrieverState:
    settings: RetrieverSettings
    metrics: RetrieverMetrics
    pool: Pool | None = None
    ingestor: ImageIngestor | None = None
    load_error: str | None = None
    backend: PoolBackend | None = None  # faiss in process, or a Milvus collection (set at start-up)
    loader: threading.Thread | None = field(default=None, repr=False)
    trainer: IndexTrainer | None = field(default=None, repr=False)

    @property
    def ready(self) -> bool:
        return self.pool is not None and self.pool.index is not None

    def search_body_limit(self) -> int:
        """The largest ``POST /search`` body a search of this pool can use: ``max_queries`` vectors of the pool's
        dimension as JSON numbers (26 bytes each, more than a float's shortest form needs), or the query images
        (``max_search_image_bytes``, base64) when the pool embeds images, plus ``exclude_ids`` (100,000 ids of
        this pool) and 64 KiB for the other fields; never more than ``max_upload_bytes``."""
        s = self.settings
        if self.pool is None:
            return s.max_upload_bytes
        queries = s.max_queries * self.pool.info.dim * 26
        if self.ingestor is not None:
            queries = max(queries, (s.max_search_image_bytes + 2) // 3 * 4 + s.max_queries * 4)
        excluded = 100_000 * (len(self.pool.info.tag) + 25)
        return min(s.max_upload_bytes, queries + excluded + 64 * 1024)


async def get_state(request: Request) -> RetrieverState:
    state: RetrieverState = request.app.state.retriever
    return state


StateDep = Annotated[RetrieverState, Depends(get_state)]


async def get_settings(state: StateDep) -> RetrieverSettings:
    return state.settings


async def get_pool(state: StateDep) -> Pool:
    if state.load_error:
        raise NotReadyError(f"the pool failed to load: {state.load_error}")
    if not state.ready or state.pool is None:
        raise NotReadyError("the index is still loading or being rebuilt; retry in a moment")
    return state.pool


async def get_ingestor(state: StateDep) -> ImageIngestor:
    if state.ingestor is None:
        raise PoolConflictError("this retriever is vectors-only (T3AR_RETRIEVER_EMBEDDER=none): it cannot embed "
                                "images; send vectors, or use a retriever configured with an embedder")
    return state.ingestor


SettingsDep = Annotated[RetrieverSettings, Depends(get_settings)]
PoolDep = Annotated[Pool, Depends(get_pool)]
IngestorDep = Annotated["ImageIngestor", Depends(get_ingestor)]

_bearer = HTTPBearer(auto_error=False, description="T3AR_RETRIEVER_TOKEN (read/write) or _ADMIN_TOKEN")
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


_ADMIN_WORDS = "this operation needs the admin token (T3AR_RETRIEVER_ADMIN_TOKEN)"


@route_scope("token")
async def require_token(settings: SettingsDep, creds: BearerDep) -> None:
    require(settings, creds)


@route_scope("admin", _ADMIN_WORDS)
async def require_admin(settings: SettingsDep, creds: BearerDep) -> None:
    require(settings, creds, admin=_ADMIN_WORDS)

"""Pool curation routes (admin): find near-duplicate clusters by R's embedding. The API's compaction
(``POST /pool/compact`` there) asks this, keeps the answer as its plan and removes exactly those ids with
ordinary deletes."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from t3ar_services.retriever import schemas as s
from t3ar_services.retriever.curation import NearDuplicatesRequest, NearDuplicatesResponse, near_duplicates
from t3ar_services.retriever.deps import PoolDep, require_admin

_ERRORS: dict[int | str, dict[str, Any]] = {c: {"model": s.ErrorBody} for c in (400, 401, 403, 409, 413, 422, 503)}
router = APIRouter(responses=_ERRORS)


@router.post("/pool/near-duplicates", response_model=NearDuplicatesResponse, dependencies=[Depends(require_admin)],
             tags=["pool"])
def find_near_duplicates(pool: PoolDep, body: NearDuplicatesRequest) -> NearDuplicatesResponse:
    """Which items of ``sources`` are near-duplicates (cosine >= ``threshold``) of an item that stays, greedy
    and oldest first: items of other sources always stay. Read-only: nothing is removed here."""
    pool.live_index()  # 503 while the pool is still loading, like every pool route
    return near_duplicates(pool.store.path, pool.info.dim, pool.format_id, body)

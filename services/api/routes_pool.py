"""Admin operations on the pool as a whole: withdraw a job's contribution as one unit, and compaction
(near-duplicates found by R through the index; dry-run by default; a real run removes exactly what a dry-run
listed). Both remove through ordinary deletes and answer with the lineage of what they removed."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from t3ar.errors import InvalidInputError
from t3ar_services.api import schemas as s
from t3ar_services.api.contributions import source_of
from t3ar_services.api.deps import ADMIN, ApiState, StateDep
from t3ar_services.api.jobs import require_job
from t3ar_services.api.routes import lineage_job_outs

_ERRORS: dict[int | str, dict[str, Any]] = {c: {"model": s.ErrorBody} for c in (401, 403, 404, 409, 422, 502, 503)}
router = APIRouter(responses=_ERRORS, dependencies=ADMIN, tags=["pool"])


def _lineage_jobs(request: Request, state: ApiState, pool_ids: list[str], *,
                  exclude: str | None = None) -> list[s.LineageJob]:
    state.jobs.sync_lineage()
    return lineage_job_outs(request, state, state.contributor.records.jobs_using_any(pool_ids), exclude=exclude)


@router.delete("/jobs/{job_id}/contribution", response_model=s.ContributionWithdrawn)
def withdraw_contribution(request: Request, state: StateDep, job_id: str) -> s.ContributionWithdrawn:
    """Withdraw every pool item job ``job_id`` contributed, as one unit, with the guarantee of
    ``DELETE /pool/{id}`` (no search returns them once this answers; their bytes are gone; also after a
    restart). Answers with the later jobs that retrieved any of them (readapt those). 404: unknown job, or
    already withdrawn; 409: the job made no contribution (not asked, still running, failed or canceled)."""
    require_job(state.store, job_id)
    ids = state.contributor.withdraw(job_id)
    state.metrics.pool_deletes.inc(len(ids))
    return s.ContributionWithdrawn(job_id=job_id, source=source_of(job_id), withdrawn=ids,
                                   jobs=_lineage_jobs(request, state, ids, exclude=job_id),
                                   in_flight=state.jobs.started_ids())


@router.post("/pool/compact", response_model=s.CompactResponse,
             responses={400: {"model": s.ErrorBody, "description": "unparsable JSON body"}})
def compact(request: Request, state: StateDep, body: s.CompactRequest) -> s.CompactResponse:
    """Remove near-duplicates (R's embedding, cosine >= ``threshold``) from the pool, keeping one item per
    cluster; only items of ``sources`` are removed (items of other sources always stay and are preferred as
    the one kept; otherwise the oldest stays). **Dry-run by default**: lists what would be removed and the bytes
    it would free, stores that list as a plan and changes nothing. ``dry_run: false`` with the dry-run's
    ``plan_id`` removes exactly those ids, through ordinary deletes, and answers with their lineage; 409 and
    nothing removed when the pool changed since (an item to remove or to keep is gone)."""
    if body.dry_run:
        if body.plan_id is not None:
            raise InvalidInputError("plan_id applies a plan: send it with dry_run=false")
        if body.threshold is None or not body.sources:
            raise InvalidInputError("a dry-run needs threshold (0 < t <= 1) and sources (which sources' items may "
                                    "be removed, e.g. [\"target:*\"])")
        plan_id, found = state.compactor.plan(body.threshold, body.sources, body.nprobe)
        return s.CompactResponse(dry_run=True, plan_id=plan_id, threshold=body.threshold, sources=body.sources,
                                 remove=[s.CompactRemoval(**r) for r in found["remove"]], bytes_freed=found["bytes"],
                                 clusters=found["clusters"], scanned=found["scanned"], items=found["items"],
                                 method=found["method"], seconds=found["seconds"])
    if body.plan_id is None:
        raise InvalidInputError("a real run removes exactly what a dry-run listed: run the dry-run (dry_run=true) "
                                "and send its plan_id with dry_run=false")
    if body.threshold is not None or body.sources is not None:
        raise InvalidInputError("a real run applies the plan as listed: send only plan_id (and dry_run=false)")
    result = state.compactor.apply(body.plan_id)
    plan = state.contributor.records.get_plan(body.plan_id)
    assert plan is not None
    removed = set(result["removed"])
    state.metrics.pool_deletes.inc(len(removed))
    return s.CompactResponse(dry_run=False, plan_id=body.plan_id, threshold=plan.params["threshold"],
                             sources=plan.params["sources"],
                             remove=[s.CompactRemoval(**r) for r in plan.plan["remove"] if r["id"] in removed],
                             bytes_freed=result["bytes_freed"], clusters=plan.plan["clusters"],
                             scanned=plan.plan["scanned"], items=plan.plan["items"], method=plan.plan["method"],
                             jobs=_lineage_jobs(request, state, result["removed"]),
                             in_flight=state.jobs.started_ids())

"""The pool as the API sees it: an item's lineage (any user), and, for admins, withdrawing one item, withdrawing a
job's contribution as one unit, and compaction (:mod:`t3ar_services.api.domain.pool`). Every removal answers with
the lineage of what it removed."""

from __future__ import annotations

from fastapi import APIRouter

from t3ar_services.api import schemas as s
from t3ar_services.api.deps import ADMIN, USER, ClientDep, LinksDep, PrincipalDep, StateDep
from t3ar_services.api.domain import access, pool

router = APIRouter(responses=s.error_responses(401, 403, 404, 409, 413, 422, 502, 503), tags=["pool"])


@router.get("/pool/{pool_id}/lineage", response_model=s.LineageResponse, dependencies=USER)
def pool_lineage(state: StateDep, links: LinksDep, who: PrincipalDep, pool_id: str) -> s.LineageResponse:
    """Which finished jobs retrieved this pool item (whether or not it is still in the pool): those of your team
    (an admin: of every team)."""
    return access.visible_lineage(state, who, pool.lineage(state, links, pool_id))


@router.delete("/pool/{pool_id}", response_model=s.DeleteResponse, dependencies=ADMIN)
def delete_pool_item(state: StateDep, links: LinksDep, who: PrincipalDep, client: ClientDep,
                     pool_id: str) -> s.DeleteResponse:
    """Withdraw a pool item (forwarded to the retriever with its admin token; once this returns no search returns
    it) and answer with its lineage: every finished job whose adaptation retrieved it. Re-run those with
    ``POST /jobs/{id}/readapt`` to get checkpoints that never saw it. ``in_flight`` lists jobs running now."""
    done = pool.withdraw_item(state, links, pool_id)
    access.record(state, who, "pool.withdraw", pool_id, client, detail=f"jobs={len(done.jobs)}")
    return done


@router.post("/pool/{pool_id}/readmit", response_model=s.ReadmitResponse, dependencies=ADMIN)
def readmit_pool_item(state: StateDep, who: PrincipalDep, client: ClientDep, pool_id: str) -> s.ReadmitResponse:
    """Re-admit a withdrawn image's content: a withdrawal refuses the same bytes, and near-duplicates by the
    ingest's rule, at every later ingest; this lifts that for ``pool_id`` (audited as ``pool.readmit``). The item
    itself stays withdrawn: adding the image again makes a new item."""
    done = pool.readmit(state, pool_id)
    access.record(state, who, "pool.readmit", pool_id, client, detail=f"sha256={done.sha256}")
    return done


@router.delete("/jobs/{job_id}/contribution", response_model=s.ContributionWithdrawn, dependencies=ADMIN)
def withdraw_contribution(state: StateDep, links: LinksDep, who: PrincipalDep, client: ClientDep,
                          job_id: str) -> s.ContributionWithdrawn:
    """Withdraw every pool item job ``job_id`` contributed, as one unit, with the guarantee of
    ``DELETE /pool/{id}`` (no search returns them once this answers; their bytes are gone; also after a
    restart). Answers with the later jobs that retrieved any of them (readapt those). 404: unknown job, or
    already withdrawn; 409: the job made no contribution (not asked, still running, failed or canceled)."""
    done = pool.withdraw_contribution(state, links, job_id)
    access.record(state, who, "contribution.withdraw", job_id, client)
    return done


@router.post("/pool/compact", response_model=s.CompactResponse, dependencies=ADMIN,
             responses={400: {"model": s.ErrorBody, "description": "unparsable JSON body"}})
def compact(state: StateDep, links: LinksDep, who: PrincipalDep, client: ClientDep,
            body: s.CompactRequest) -> s.CompactResponse:
    """Remove near-duplicates (R's embedding, cosine >= ``threshold``) from the pool, keeping one item per
    cluster; only items of ``sources`` are removed (items of other sources always stay and are preferred as
    the one kept; otherwise the oldest stays). **Dry-run by default**: lists what would be removed and the bytes
    it would free, stores that list as a plan and changes nothing. ``dry_run: false`` with the dry-run's
    ``plan_id`` removes exactly those ids, through ordinary deletes, and answers with their lineage; 409 and
    nothing removed when the pool changed since (an item to remove or to keep is gone)."""
    done = pool.compact(state, links, body)
    if not body.dry_run:
        access.record(state, who, "pool.compact", done.plan_id, client, detail=f"removed={len(done.remove)}")
    return done

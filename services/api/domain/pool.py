"""The pool as the API sees it: lineage (which finished jobs retrieved an item), withdrawal of one item or of a
job's contribution as one unit, and compaction (a dry-run plan, then exactly that plan applied). Every removal
answers with the lineage of what it removed, so the caller can readapt the jobs that used it."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from t3ar.clients.retriever_errors import RetrieverInputError, RetrieverNotFoundError
from t3ar.clients.retriever_models import AddItemResult
from t3ar.errors import InvalidInputError
from t3ar_services.api import schemas as s
from t3ar_services.api.contributions import source_of
from t3ar_services.api.deps import ApiState
from t3ar_services.api.domain import Links
from t3ar_services.api.domain.jobs import Rerun
from t3ar_services.api.errors import NotFoundError
from t3ar_services.api.jobs import require_job

log = logging.getLogger(__name__)


def lineage_jobs(state: ApiState, links: Links, used: Iterable[tuple[str, str | None]], *,
                 exclude: str | None = None) -> list[s.LineageJob]:
    """The jobs of (job id, finished at) pairs as the API shows them: links to the job, its checkpoint and a
    readapt, and the model it adapted."""
    out = []
    for job_id, finished_at in used:
        if job_id == exclude:
            continue
        row = state.store.get_job(job_id)
        out.append(s.LineageJob(job_id=job_id, url=links("get_job", job_id),
                                checkpoint_url=links("get_checkpoint", job_id), readapt_url=links("readapt", job_id),
                                model_id=row.model_id if row else None, finished_at=finished_at))
    return out


def _jobs_using(state: ApiState, links: Links, pool_id: str) -> list[s.LineageJob]:
    try:
        state.jobs.sync_lineage()  # skips (and logs once) a record it cannot index: never a 500 here
    except Exception as e:
        log.warning("lineage sync failed: %s", e)
    return lineage_jobs(state, links, state.store.jobs_using(pool_id))


def _jobs_using_any(state: ApiState, links: Links, pool_ids: list[str], *,
                    exclude: str | None = None) -> list[s.LineageJob]:
    return lineage_jobs(state, links, state.contributor.records.jobs_using_any(pool_ids), exclude=exclude)


def lineage(state: ApiState, links: Links, pool_id: str) -> s.LineageResponse:
    """Which finished jobs retrieved this pool item (whether or not it is still in the pool), and the running
    jobs (which may have retrieved it already)."""
    return s.LineageResponse(pool_id=pool_id, jobs=_jobs_using(state, links, pool_id),
                             in_flight=state.jobs.started_ids())


@dataclass(frozen=True)
class Aftermath:
    """What a withdrawn item's page says of the jobs around it. ``withdrawn_at``: when (None: not recorded, e.g.
    withdrawn by an older API); ``reruns``: the re-runs of the jobs that used it made after the withdrawal, which
    run against the pool without it; ``may_have_used``: other running jobs that started before the withdrawal
    (or at an unknown time), which may have retrieved it; ``started_after``: running jobs that started after it,
    which cannot have."""

    withdrawn_at: str | None
    reruns: list[tuple[Rerun, str]] = field(default_factory=list)  # (the re-run, the job it re-runs)
    may_have_used: list[str] = field(default_factory=list)
    started_after: list[str] = field(default_factory=list)


def _time(value: str | None) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(value) if value else None
    except ValueError:
        return None


def aftermath(state: ApiState, lineage_: s.LineageResponse) -> Aftermath:
    """:class:`Aftermath` of a withdrawn item whose (visible) lineage is ``lineage_``."""
    at = state.contributor.records.withdrawn_at(lineage_.pool_id)
    when = _time(at)
    if when is None:
        return Aftermath(at, may_have_used=list(lineage_.in_flight))
    reruns = []
    for job in lineage_.jobs:
        for r in state.store.reruns_of(job.job_id):
            made = _time(r.created_at)
            if made is not None and made >= when:
                reruns.append((Rerun(r.id, state.jobs.state(r).status, r.created_at), job.job_id))
    mine = {r.job_id for r, _ in reruns}
    before: list[str] = []
    after: list[str] = []
    for job_id in lineage_.in_flight:
        if job_id in mine:
            continue
        row = state.store.get_job(job_id)
        started = _time(state.jobs.state(row).started_at) if row is not None else None
        (after if started is not None and started > when else before).append(job_id)
    return Aftermath(at, reruns, before, after)


def known_gone(state: ApiState, lineage_: s.LineageResponse) -> bool:
    """Whether a pool id the pool does not hold (``lineage_`` is its lineage) was ever in it: withdrawn through
    this API (the withdrawal log), or retrieved by a job. False for an id never seen (a typo, a made-up link)."""
    from t3ar_services.common.withdrawn import was_withdrawn

    return bool(lineage_.jobs) or was_withdrawn(state.redis, lineage_.pool_id)


def withdraw_item(state: ApiState, links: Links, pool_id: str) -> s.DeleteResponse:
    """Withdraw a pool item (no search returns it once this returns) with its lineage; 404 when it is not in the
    pool. Once the retriever deleted it the answer is a success, with whatever lineage could be read."""
    try:
        state.withdrawer.withdraw([pool_id], "delete")  # recorded, caches told, lineage synced
    except RetrieverNotFoundError as e:
        raise NotFoundError(f"no pool item {pool_id!r} (already withdrawn, or never added); which jobs used it: "
                            f"GET /pool/{pool_id}/lineage") from e
    # the item is gone at the retriever: from here on the answer is a 2xx with whatever lineage is readable
    jobs: list[s.LineageJob] = []
    problems = []
    try:
        jobs = lineage_jobs(state, links, state.store.jobs_using(pool_id))
    except Exception as e:
        log.exception("pool item %s withdrawn, but its lineage could not be read", pool_id)
        problems.append(f"its lineage could not be read ({type(e).__name__})")
    in_flight: list[str] = []
    try:
        in_flight = state.jobs.started_ids()
    except Exception as e:
        log.warning("pool item %s withdrawn; the running jobs could not be listed: %s", pool_id, e)
        problems.append(f"the running jobs could not be listed ({type(e).__name__})")
    error = f"the item was withdrawn, but {' and '.join(problems)}: GET /pool/{pool_id}/lineage later" \
        if problems else None
    return s.DeleteResponse(pool_id=pool_id, jobs=jobs, in_flight=in_flight, deleted=True, lineage_error=error)


def readmit(state: ApiState, pool_id: str) -> s.ReadmitResponse:
    """Lift the withdrawal of ``pool_id`` at the retriever (an admin's decision: its content, refused at ingest
    since, may be added again). 404 when it is not a withdrawn image."""
    try:
        w = state.retriever_admin.readmit(pool_id)
    except RetrieverNotFoundError as e:
        raise NotFoundError(f"no withdrawn image {pool_id!r} (never withdrawn, already re-admitted, or a "
                            "vectors-only item)") from e
    return s.ReadmitResponse(pool_id=pool_id, sha256=w.sha256, withdrawn_at=w.withdrawn_at)


def withdraw_contribution(state: ApiState, links: Links, job_id: str) -> s.ContributionWithdrawn:
    """Withdraw every pool item job ``job_id`` contributed, as one unit, with the later jobs that retrieved any of
    them. 404: unknown job, or already withdrawn; 409: the job made no contribution."""
    require_job(state.store, job_id)
    ids = state.contributor.withdraw(job_id)
    return s.ContributionWithdrawn(job_id=job_id, source=source_of(job_id), withdrawn=ids,
                                   jobs=_jobs_using_any(state, links, ids, exclude=job_id),
                                   in_flight=state.jobs.started_ids())


def compact(state: ApiState, links: Links, body: s.CompactRequest) -> s.CompactResponse:
    """A dry-run (the default) lists what would be removed and stores it as a plan; a real run applies a plan
    exactly (409, nothing removed, when the pool changed since) and answers with the lineage of what it
    removed. Mixing the two modes' fields is a 422."""
    if body.dry_run:
        if body.plan_id is not None:
            raise InvalidInputError("plan_id applies a plan: send it with dry_run=false")
        if body.threshold is None or not body.sources:
            raise InvalidInputError("a dry-run needs threshold (0 < t <= 1) and sources (which sources' items may "
                                    "be removed, e.g. [\"target:*\"])")
        plan_id, found = state.compactor.plan(body.threshold, body.sources, body.nprobe)
        return s.CompactResponse(dry_run=True, plan_id=plan_id, threshold=body.threshold, sources=body.sources,
                                 remove=[s.CompactRemoval(**r.model_dump()) for r in found.remove],
                                 bytes_freed=found.bytes, clusters=found.clusters, scanned=found.scanned,
                                 items=found.items, method=found.method, seconds=found.seconds)
    if body.plan_id is None:
        raise InvalidInputError("a real run removes exactly what a dry-run listed: run the dry-run (dry_run=true) "
                                "and send its plan_id with dry_run=false")
    if body.threshold is not None or body.sources is not None:
        raise InvalidInputError("a real run applies the plan as listed: send only plan_id (and dry_run=false)")
    result = state.compactor.apply(body.plan_id)
    plan = state.contributor.records.get_plan(body.plan_id)
    assert plan is not None
    removed = set(result["removed"])
    return s.CompactResponse(dry_run=False, plan_id=body.plan_id, threshold=plan.params["threshold"],
                             sources=plan.params["sources"],
                             remove=[s.CompactRemoval(**r) for r in plan.plan["remove"] if r["id"] in removed],
                             bytes_freed=result["bytes_freed"], clusters=plan.plan["clusters"],
                             scanned=plan.plan["scanned"], items=plan.plan["items"], method=plan.plan["method"],
                             jobs=_jobs_using_any(state, links, result["removed"]),
                             in_flight=state.jobs.started_ids())


def ingest(state: ApiState, files: list[tuple[str, bytes]], source: str, label: str | None,
           metadata: dict[str, str]) -> tuple[list[AddItemResult], bool]:
    """Add images (and zip/tar archives of images) to the pool through the API's read/write retriever client,
    under the retriever's own checks and limits (image size and pixels, archive safety, files per request, source
    and label rules); exact and near-duplicates of pool items are skipped (``skip``). Returns the retriever's
    per-file report and whether anything was committed; a request the retriever refuses as a whole (every file
    rejected) comes back as its report with ``False``, other refusals raise (4xx)."""
    try:
        out = state.retriever.add_images(files, source=source, metadata=metadata, duplicate_policy="skip",
                                         label=label or None)
    except RetrieverInputError as e:
        if e.items:
            return list(e.items), False
        raise
    return out.items, True

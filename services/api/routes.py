"""Operations (health, readiness, metrics), base models, and pool withdrawal with lineage."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Request, Response, UploadFile
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from rq import Worker

from t3ar.clients.retriever_errors import RetrieverNotFoundError
from t3ar_services.api import schemas as s
from t3ar_services.api.deps import ADMIN, USER, ApiState, StateDep
from t3ar_services.api.errors import NotFoundError
from t3ar_services.api.registry import register_model
from t3ar_services.api.store import ModelRow
from t3ar_services.api.uploads import sent_name
from t3ar_services.common.body_limit import body_size
from t3ar_services.common.forms import only_fields
from t3ar_services.common.job_contract import WITHDRAWN_KEY

log = logging.getLogger(__name__)
_ERRORS: dict[int | str, dict[str, Any]] = {c: {"model": s.ErrorBody} for c in (401, 403, 404, 409, 413, 422, 503)}
# What JSON Schema cannot state about the upload: the file part is a t3ar checkpoint (the torch zip that
# `t3ar train-source` writes), named by this media type in the document.
CHECKPOINT_MEDIA_TYPE = "application/vnd.t3ar.checkpoint"

router = APIRouter(responses=_ERRORS)


@router.get("/health", response_model=s.HealthResponse, tags=["ops"])
def health() -> s.HealthResponse:
    return s.HealthResponse()


@router.get("/ready", response_model=s.ReadyResponse, tags=["ops"])
def ready(state: StateDep) -> Any:
    """Ready when Redis answers and the retriever is ready (200), else 503 with what is missing."""
    problems = []
    try:
        state.redis.ping()
        redis_ok = True
        workers = Worker.count(queue=state.jobs.queue)
    except Exception as e:
        redis_ok, workers = False, 0
        problems.append(f"redis: {type(e).__name__}: {e}")
    retriever_ok = state.retriever.ready()
    if not retriever_ok:
        problems.append(f"retriever at {state.settings.retriever_url} is not ready")
    body = s.ReadyResponse(ready=redis_ok and retriever_ok, redis=redis_ok, retriever=retriever_ok, workers=workers,
                           detail="; ".join(problems) or None)
    return JSONResponse(body.model_dump(), status_code=200 if body.ready else 503)


@router.get("/metrics", tags=["ops"], response_class=Response)
def metrics(state: StateDep) -> Response:
    m = state.metrics
    try:
        for name, value in state.jobs.counts().items():
            m.jobs.labels(name).set(value)
        m.workers.set(Worker.count(queue=state.jobs.queue))
    except Exception:  # scrapes must work while Redis is down
        pass
    return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)


def _model_out(m: ModelRow) -> s.ModelOut:
    return s.ModelOut(id=m.id, name=m.name, sha256=m.sha256, size=m.size, arch=m.arch, image_size=m.image_size,
                      num_classes=len(m.classes), classes=m.classes, uploaded_at=m.uploaded_at)


@router.post("/models", response_model=s.ModelOut, status_code=201, tags=["models"],
             dependencies=[*USER, body_size("model"), only_fields("file", "name")],
             responses={200: {"model": s.ModelOut, "description": "the same file was uploaded before"},
                        400: {"model": s.ErrorBody, "description": "unparsable multipart body"}},
             openapi_extra={"requestBody": {"content": {"multipart/form-data": {"encoding": {
                 "file": {"contentType": CHECKPOINT_MEDIA_TYPE}}}}}})
def upload_model(state: StateDep,
                 file: Annotated[UploadFile, File(description="a t3ar checkpoint (t3ar train-source)")],
                 name: Annotated[str, Form(max_length=200)] = "") -> JSONResponse:
    """Upload a base checkpoint. It is loaded safely (``weights_only``) and its weights must fit the architecture
    it declares. The id derives from the file's sha256: the same file gives the same id (200 instead of 201)."""
    row, created = register_model(state.store, state.settings, file.file, name or (file.filename or ""),
                                  sent_name(file.filename, "the checkpoint"))
    if created:
        state.metrics.models_uploaded.inc()
    return JSONResponse(_model_out(row).model_dump(), status_code=201 if created else 200)


@router.get("/models", response_model=s.ModelList, dependencies=USER, tags=["models"])
def list_models(state: StateDep) -> s.ModelList:
    return s.ModelList(models=[_model_out(m) for m in state.store.list_models()])


@router.get("/models/{model_id}", response_model=s.ModelOut, dependencies=USER, tags=["models"])
def get_model(state: StateDep, model_id: str) -> s.ModelOut:
    row = state.store.get_model(model_id)
    if row is None:
        raise NotFoundError(f"no model {model_id!r}; list them with GET /models")
    return _model_out(row)


def _lineage_jobs(request: Request, state: ApiState, pool_id: str) -> list[s.LineageJob]:
    try:
        state.jobs.sync_lineage()  # skips (and logs once) a record it cannot index: never a 500 here
    except Exception as e:
        log.warning("lineage sync failed: %s", e)
    return lineage_job_outs(request, state, state.store.jobs_using(pool_id))


def lineage_job_outs(request: Request, state: ApiState, used: Iterable[tuple[str, Any]], *,
                     exclude: str | None = None) -> list[s.LineageJob]:
    """The jobs of (job id, finished at) pairs as the API shows them: links to the job, its checkpoint and a
    readapt, and the model it adapted."""
    out = []
    for job_id, finished_at in used:
        if job_id == exclude:
            continue
        row = state.store.get_job(job_id)
        out.append(s.LineageJob(job_id=job_id, url=str(request.url_for("get_job", job_id=job_id)),
                                checkpoint_url=str(request.url_for("get_checkpoint", job_id=job_id)),
                                readapt_url=str(request.url_for("readapt", job_id=job_id)),
                                model_id=row.model_id if row else None, finished_at=finished_at))
    return out


def _lineage(request: Request, state: ApiState, pool_id: str) -> s.LineageResponse:
    return s.LineageResponse(pool_id=pool_id, jobs=_lineage_jobs(request, state, pool_id),
                             in_flight=state.jobs.started_ids())


@router.get("/pool/{pool_id}/lineage", response_model=s.LineageResponse, dependencies=USER, tags=["pool"])
def pool_lineage(request: Request, state: StateDep, pool_id: str) -> s.LineageResponse:
    """Which finished jobs retrieved this pool item (whether or not it is still in the pool)."""
    return _lineage(request, state, pool_id)


@router.delete("/pool/{pool_id}", response_model=s.DeleteResponse, dependencies=ADMIN, tags=["pool"])
def delete_pool_item(request: Request, state: StateDep, pool_id: str) -> s.DeleteResponse:
    """Withdraw a pool item (forwarded to the retriever with its admin token; once this returns no search returns
    it) and answer with its lineage: every finished job whose adaptation retrieved it. Re-run those with
    ``POST /jobs/{id}/readapt`` to get checkpoints that never saw it. ``in_flight`` lists jobs running now."""
    try:
        state.retriever_admin.delete(pool_id)
    except RetrieverNotFoundError as e:
        raise NotFoundError(f"no pool item {pool_id!r} (already withdrawn, or never added); which jobs used it: "
                            f"GET /pool/{pool_id}/lineage") from e
    state.metrics.pool_deletes.inc()
    try:
        state.redis.sadd(WITHDRAWN_KEY, pool_id)  # workers drop it from their image caches
    except Exception as e:  # the withdrawal itself succeeded; caches are also bounded and trimmed
        log.warning("could not record withdrawn id %s for worker caches: %s", pool_id, e)
    # the item is gone at the retriever: from here on the answer is a 2xx with whatever lineage is readable
    jobs: list[s.LineageJob] = []
    problems = []
    try:
        jobs = _lineage_jobs(request, state, pool_id)
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

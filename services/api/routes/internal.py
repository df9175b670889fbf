"""The worker routes (``/internal/...``, the worker token only): a job's inputs down, its checkpoint and result
up. The contract (paths, digests, ordering) is :mod:`t3ar_services.common.job_contract`; storage and
verification are :mod:`t3ar_services.api.transfer`.

Every job route needs the job's own secret besides the worker token (:func:`require_job_secret`). Uploads are
accepted while the job is ``started`` (a worker is running it). A finished job keeps its
artifacts: the same checkpoint or result again answers 200 with ``stored: false`` (a worker's retry), anything
else 409; a canceled or failed job (e.g. failed as abandoned while a partitioned worker went on) refuses with
409, so a late upload never resurrects it.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from t3ar_services.api import schemas as s
from t3ar_services.api.deps import WORKER, ApiState, StateDep
from t3ar_services.api.errors import ConflictError, NotFoundError
from t3ar_services.api.holdout import holdout_of
from t3ar_services.api.jobs import require_job
from t3ar_services.api.registry import model_path, require_model
from t3ar_services.api.store import JobRow
from t3ar_services.api.transfer import target_tar
from t3ar_services.api.verify import check_checkpoint, check_result
from t3ar_services.common.body_limit import body_size
from t3ar_services.common.errors import AuthError
from t3ar_services.common.job_contract import JOB_SECRET_HEADER, SHA256_PATTERN, secret_digest
from t3ar_services.common.json_body import json_body_doc, read_json

router = APIRouter(prefix="/internal", responses=s.error_responses(401, 403, 404, 409, 413, 422, 503),
                   dependencies=WORKER, tags=["workers"])
_OCTET = {"requestBody": {"required": True, "content": {"application/octet-stream": {
    "schema": {"type": "string", "format": "binary"}}}}}
Sha256 = Annotated[str, Query(pattern=SHA256_PATTERN, description="sha256 of the body (lower-case hex)")]


@router.get("/ping", response_model=s.WorkerPing)
def ping(state: StateDep) -> s.WorkerPing:
    """A worker's start-up and health check: the API answers and takes this worker token."""
    return s.WorkerPing(queue=state.settings.queue)


@router.get("/jobs/{job_id}/target", response_class=FileResponse,
            responses={200: {"content": {"application/x-tar": {}}, "description": "the target as one tar"}})
def get_target(request: Request, state: StateDep, job_id: str) -> FileResponse:
    """The job's validated target (images + labels.csv) as one uncompressed tar; its sha256 is the job's
    ``target_sha256`` (also in ``X-Checksum-Sha256``)."""
    row = require_job_secret(request, state, job_id)
    tar = target_tar(state.settings.data_dir, row.target_dir)
    return FileResponse(tar.path, media_type="application/x-tar", headers={"X-Checksum-Sha256": tar.sha256})


@router.get("/jobs/{job_id}/holdout", response_class=FileResponse,
            responses={200: {"content": {"application/x-tar": {}}, "description": "the holdout as one tar"}})
def get_holdout(request: Request, state: StateDep, job_id: str) -> FileResponse:
    """The job's acceptance holdout (class folders, or images + labels.csv) as one uncompressed tar; its sha256 is
    the job's ``holdout_sha256``. 404 for a job without one."""
    row = require_job_secret(request, state, job_id)
    found = holdout_of(state.settings.data_dir, row.target_dir)
    if found is None:
        raise NotFoundError(f"job {job_id} has no holdout")
    tar = target_tar(state.settings.data_dir, found[0])
    return FileResponse(tar.path, media_type="application/x-tar", headers={"X-Checksum-Sha256": tar.sha256})


@router.get("/jobs/{job_id}/base-model", response_class=FileResponse,
            responses={200: {"content": {"application/octet-stream": {}}, "description": "the base checkpoint"}})
def get_base_model(request: Request, state: StateDep, job_id: str) -> FileResponse:
    """The job's base checkpoint; its sha256 is the job's ``model_sha256`` (also in ``X-Checksum-Sha256``)."""
    row = require_job_secret(request, state, job_id)
    model = require_model(state.store, state.settings, row.model_id)
    return FileResponse(model_path(state.settings.data_dir, model.id), media_type="application/octet-stream",
                        headers={"X-Checksum-Sha256": model.sha256})


def require_job_secret(request: Request, state: ApiState, job_id: str) -> JobRow:
    """The job, if the request shows its own secret (:data:`JOB_SECRET_HEADER`; 403 otherwise): the worker
    token opens the worker routes, the secret (only in the job's payload) binds them to the job a worker
    dequeued."""
    row = require_job(state.store, job_id)
    if state.settings.auth_disabled:
        return row
    given = request.headers.getlist(JOB_SECRET_HEADER)
    if len(given) != 1 or not hmac.compare_digest(secret_digest(given[0]), row.secret_sha256):
        raise AuthError(f"job {job_id}'s worker routes need its own secret ({JOB_SECRET_HEADER}), which only the "
                        "worker that dequeued it has: the worker token alone opens no job", status=403)
    return row


def _check_running(state: ApiState, job_id: str) -> None:
    st = state.jobs.state(require_job(state.store, job_id))
    if st.status != "started":
        raise ConflictError(f"job {job_id} is {st.status}, not running: its artifacts are not accepted")


@router.put("/jobs/{job_id}/checkpoint", response_model=s.CheckpointStored, openapi_extra=_OCTET,
            dependencies=[body_size("checkpoint")])
async def put_checkpoint(request: Request, state: StateDep, job_id: str, sha256: Sha256) -> s.CheckpointStored:
    """Store the adapted checkpoint (the raw body, streamed) if it hashes to ``sha256`` and is a t3ar checkpoint
    of this job (its base model, target images and config: 422 ``bad_checkpoint`` otherwise); nothing is stored
    on any 4xx. Idempotent: the same checkpoint again is 200; a finished job's is never replaced (409)."""
    row = await run_in_threadpool(require_job_secret, request, state, job_id)
    if await run_in_threadpool(state.artifacts.refuse_if_finished, job_id, sha256, "checkpoint"):
        return s.CheckpointStored(job_id=job_id, sha256=sha256, size=0, stored=False)
    await run_in_threadpool(_check_running, state, job_id)
    model = await run_in_threadpool(require_model, state.store, state.settings, row.model_id)
    size = await state.artifacts.put_checkpoint(
        job_id, sha256, request.stream(), verify=lambda path: check_checkpoint(path, state.settings, row, model))
    return s.CheckpointStored(job_id=job_id, sha256=sha256, size=size, stored=True)


@router.put("/jobs/{job_id}/result", response_model=s.ResultStored, dependencies=[body_size("result")],
            openapi_extra=json_body_doc(s.WorkerResult))
async def put_result(request: Request, state: StateDep, job_id: str) -> s.ResultStored:
    """Finish the job: its report and lineage (a :class:`~t3ar_services.api.schemas.WorkerResult`), naming the
    checkpoint uploaded before (409 when that is missing or differs; 422, with nothing written, when the lineage
    is not the one inside that checkpoint or the report holds what JSON cannot answer with). The job's secret is
    checked before the body is read (bounded by ``T3AR_API_MAX_RESULT_BYTES``). The lineage is indexed at once
    (``GET /pool/{id}/lineage``)."""
    row = await run_in_threadpool(require_job_secret, request, state, job_id)
    body = await read_json(request, s.WorkerResult)
    return await run_in_threadpool(_store_result, state, row, body)


def _store_result(state: ApiState, row: JobRow, body: s.WorkerResult) -> s.ResultStored:
    job_id = row.id
    sha = body.lineage.checkpoint_sha256
    if not state.artifacts.refuse_if_finished(job_id, sha, "result"):
        _check_running(state, job_id)
    lineage = {**body.lineage.model_dump(mode="json"), "job_id": job_id}
    report = body.report.model_dump(mode="json")
    stored = state.artifacts.put_result(job_id, report, lineage,
                                        verify=lambda path: check_result(path, row, lineage, report))
    if stored:
        state.store.index_lineage(job_id, list(body.lineage.pool_ids), finished_at=lineage.get("created_at"),
                                  checkpoint_sha256=sha)
        state.contributor.wake()  # a requested contribution is made now, in the background
        state.registrar.wake()  # and its MLflow registration (T3AR_MLFLOW_TRACKING_URI), likewise
    return s.ResultStored(job_id=job_id, stored=stored)

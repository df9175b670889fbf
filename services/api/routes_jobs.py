"""Adaptation jobs: submit (validated before enqueueing), list, describe, cancel, download, report, readapt.

Blocking work (extraction, image decoding, Redis) runs in sync ``def`` routes, i.e. FastAPI's thread pool.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Query, Request, UploadFile
from fastapi.responses import FileResponse, JSONResponse

from t3ar.errors import InvalidInputError, T3arError
from t3ar.jobsize import kept_images
from t3ar_services.api import schemas as s
from t3ar_services.api.deps import USER, ApiState, StateDep
from t3ar_services.api.errors import ConflictError, NotFoundError, classify
from t3ar_services.api.jobs import JobState, artifact, require_job
from t3ar_services.api.registry import require_model
from t3ar_services.api.store import JobRow
from t3ar_services.api.transfer import target_tar
from t3ar_services.api.uploads import check_job_size, discard, parse_config, prepare_target, save_upload, sent_name
from t3ar_services.common.body_limit import body_size
from t3ar_services.common.forms import only_fields
from t3ar_services.common.job_contract import MODEL_FILE, REPORT_FILE, new_job_secret
from t3ar_services.common.text import readable

_ERRORS: dict[int | str, dict[str, Any]] = {c: {"model": s.ErrorBody} for c in (401, 403, 404, 409, 413, 422, 503)}
# What JSON Schema cannot state about the upload, named in the document: the archive part is one of these
# archive types (of readable images), and `config` is a JSON object of valid AdaptConfig options.
ARCHIVE_MEDIA_TYPES = ("application/zip", "application/x-tar", "application/gzip")
ADAPT_CONFIG_FORMAT = "t3ar-adapt-config"

router = APIRouter(responses=_ERRORS, dependencies=USER, tags=["jobs"])


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def _check_pool(state: ApiState, config: Any) -> None:
    """Retrieval methods need at least k pool items; say so now rather than fail in the worker."""
    if not config.uses_retrieval:
        return
    count = int(state.retriever.stats()["count"])
    if count < config.k:
        raise InvalidInputError(f"the pool has {count} item(s) but method {config.method} retrieves k={config.k} per "
                                "image: ingest more (t3ar pool ingest) or lower k")


def _check_size(state: ApiState, config: Any, n_kept: int, model_id: str) -> None:
    """The operator's per-job caps (steps, memory), with the base model's input size and head (its bottleneck
    width is in its architecture signature, ``...|bottleneck=256|...``)."""
    model = require_model(state.store, state.settings, model_id)
    found = re.search(r"\|bottleneck=(\d+)\|", model.arch)
    check_job_size(state.settings, config, n_kept, model.image_size, int(found.group(1)) if found else None,
                   len(model.classes))


def _accepted(request: Request, state: ApiState, row: JobRow, warnings: list[str], secret: str, *,
              contribute: bool = False) -> JSONResponse:
    model = require_model(state.store, state.settings, row.model_id)
    state.jobs.enqueue(row, model.sha256, target_tar(state.settings.data_dir, row.target_dir), secret)
    kind = "readapt" if row.parent_id else "adapt"
    state.metrics.jobs_submitted.labels(str(row.config.get("method")), kind).inc()
    url = str(request.url_for("get_job", job_id=row.id))
    body = s.JobAccepted(id=row.id, url=url, parent_id=row.parent_id, config=row.config,
                         target=s.TargetInfo(images=row.n_images, labelled=row.labelled, skipped=row.skipped),
                         contribute=contribute, warnings=warnings)
    return JSONResponse(body.model_dump(), status_code=202, headers={"Location": url})


@router.post("/adapt", status_code=202, response_model=s.JobAccepted,
              dependencies=[body_size("archive"),
                            only_fields("archive", "model_id", "config", "skip_bad_images", "contribute")],
              responses={400: {"model": s.ErrorBody, "description": "unparsable multipart body"}},
              openapi_extra={"requestBody": {"content": {"multipart/form-data": {"encoding": {
                  "archive": {"contentType": ", ".join(ARCHIVE_MEDIA_TYPES)}}}}}})
def adapt(
    request: Request, state: StateDep,
    archive: Annotated[UploadFile, File(description="zip/tar(.gz) of target images; labels.csv (path,label) at "
                                                    "its root switches to train-time mode")],
    model_id: Annotated[str, Form(min_length=1, description="a base model id from POST /models")],
    config: Annotated[str, Form(description="JSON object of AdaptConfig fields, e.g. "
                                            "{\"method\": \"t3ar\", \"k\": 5, \"epochs\": 2}",
                                json_schema_extra={"format": ADAPT_CONFIG_FORMAT})] = "{}",
    skip_bad_images: Annotated[bool, Form(description="drop unreadable files instead of refusing it")] = False,
    contribute: Annotated[bool, Form(description="once the job finished successfully, add its target images to "
                                                 "the pool (source target:<job id>; exact and near-duplicates of "
                                                 "pool items skipped); off by default")] = False,
) -> JSONResponse:
    """Validate the target (safe extraction, every image readable, labels known to the model, options valid,
    pool large enough) and enqueue an adaptation job. Nothing is enqueued when any check fails (4xx).
    With ``contribute=true`` the target joins the pool once the job finished (never when it fails or is
    canceled); withdraw it as one unit with ``DELETE /jobs/{id}/contribution`` (admin)."""
    settings = state.settings
    job_id = uuid.uuid4().hex
    job_dir = settings.data_dir / "jobs" / job_id
    try:
        model = require_model(state.store, settings, model_id)
        given, cfg = parse_config(config)
        upload = job_dir / "upload"
        save_upload(archive.file, upload, settings.max_upload_bytes, "the target archive",
                    "T3AR_API_MAX_UPLOAD_BYTES")
        prepared, cfg = prepare_target(upload, job_dir, settings, model.classes, given, cfg,
                                       skip_bad_images=skip_bad_images, sent=sent_name(archive.filename, "archive"))
        upload.unlink()
        _check_size(state, cfg, prepared.n_kept, model.id)
        _check_pool(state, cfg)
        secret, digest = new_job_secret()
        row = JobRow(id=job_id, model_id=model.id, parent_id=None, created_at=_now(), config=cfg.model_dump(),
                     target_dir=prepared.target_dir.relative_to(settings.data_dir).as_posix(),
                     n_images=prepared.n_images, labelled=prepared.labelled, skipped=len(prepared.skipped),
                     secret_sha256=digest)
        state.store.add_job(row)
        if contribute:
            state.contributor.records.request(job_id)  # before enqueueing: a quick job finds it
        try:
            warnings = [f"skipped {rel}: {why}" for rel, why in prepared.skipped[:20]]
            return _accepted(request, state, row, warnings, secret, contribute=contribute)
        except BaseException:
            state.contributor.records.forget(job_id)
            state.store.delete_job(job_id)
            raise
    except T3arError as e:
        state.metrics.uploads_rejected.labels(classify(e)[1]).inc()
        discard(job_dir)
        raise
    except BaseException:
        discard(job_dir)
        raise


def job_out(request: Request, state: ApiState, row: JobRow, st: JobState) -> s.JobOut:
    url = str(request.url_for("get_job", job_id=row.id))
    finished = st.status == "finished"
    return s.JobOut(
        id=row.id, url=url, status=st.status,  # type: ignore[arg-type]
        model_id=row.model_id, parent_id=row.parent_id, created_at=row.created_at,
        enqueued_at=st.enqueued_at, started_at=st.started_at, ended_at=st.ended_at, queue_position=st.position,
        worker=st.worker, config=row.config,
        target=s.TargetInfo(images=row.n_images, labelled=row.labelled, skipped=row.skipped),
        progress=s.Progress.model_validate(st.progress) if st.progress else None, error=st.error, result=st.result,
        checkpoint_url=str(request.url_for("get_checkpoint", job_id=row.id)) if finished else None,
        report_url=str(request.url_for("get_report", job_id=row.id)) if finished else None,
        contribution=s.Contribution(**state.contributor.describe(row.id, st.status)),
        neighbours_from_contributions=[s.NeighbourSource(**n) for n in state.contributor.neighbours(row.id)]
        if finished else [],
    )


@router.get("/jobs", response_model=s.JobList)
def list_jobs(request: Request, state: StateDep, limit: Annotated[int, Query(ge=1, le=200)] = 50,
              before: str | None = None) -> s.JobList:
    """Jobs, newest first. Page with ``before`` = the previous page's ``next_before``."""
    rows = state.store.list_jobs(limit=limit, before=before)
    rq_jobs = state.jobs.fetch_many([r.id for r in rows])
    out = [job_out(request, state, r, state.jobs.state(r, j)) for r, j in zip(rows, rq_jobs, strict=True)]
    return s.JobList(jobs=out, total=state.store.count_jobs(), next_before=rows[-1].id if len(rows) == limit else None)


@router.get("/jobs/{job_id}", response_model=s.JobOut)
def get_job(request: Request, state: StateDep, job_id: str) -> s.JobOut:
    """Status, progress (epoch, step, losses, pseudo-label change rate), timings, and the error when failed."""
    row = require_job(state.store, job_id)
    return job_out(request, state, row, state.jobs.state(row))


@router.post("/jobs/{job_id}/cancel", response_model=s.CancelResponse)
def cancel_job(state: StateDep, job_id: str) -> s.CancelResponse:
    """A queued job is canceled at once; a running one stops at its next step (status ``canceling`` until then)."""
    row = require_job(state.store, job_id)
    return s.CancelResponse(id=job_id, status=state.jobs.cancel(row))  # type: ignore[arg-type]


def _finished_artifact(state: ApiState, job_id: str, name: str) -> Any:
    row = require_job(state.store, job_id)
    st = state.jobs.state(row)
    if st.status != "finished":
        raise ConflictError(f"job {job_id} is {st.status}, not finished: no {name} yet"
                            + (f" ({st.error})" if st.error else ""))
    path = artifact(state.settings, job_id, name)
    if not path.is_file():
        raise NotFoundError(f"job {job_id} finished but its {name} is missing from the artifact store")
    return path


@router.get("/jobs/{job_id}/checkpoint", response_class=FileResponse,
            responses={200: {"content": {"application/octet-stream": {}}}})
def get_checkpoint(state: StateDep, job_id: str) -> FileResponse:
    """The adapted checkpoint (t3ar format; load with ``t3ar.models.checkpoint.load_checkpoint``)."""
    path = _finished_artifact(state, job_id, MODEL_FILE)
    return FileResponse(path, media_type="application/octet-stream", filename=f"t3ar-{job_id}.pt")


@router.get("/jobs/{job_id}/report")
def get_report(state: StateDep, job_id: str) -> JSONResponse:
    """Metrics of the run: steps, timings, per-epoch losses, pool items used; accuracy when labels were given;
    ``contribution`` (whether its target joined the pool: added / skipped counts) and
    ``neighbours_from_contributions`` (earlier jobs' contributions its retrieved neighbours came from)."""
    path = _finished_artifact(state, job_id, REPORT_FILE)
    report = readable(json.loads(path.read_text()))  # a report stored before issue 29 may hold NaN
    report["contribution"] = state.contributor.describe(job_id, "finished")  # the state now, not at finishing
    report["neighbours_from_contributions"] = state.contributor.neighbours(job_id)
    return JSONResponse(report)


@router.post("/jobs/{job_id}/readapt", status_code=202, response_model=s.JobAccepted)
def readapt(request: Request, state: StateDep, job_id: str) -> JSONResponse:
    """Re-run a job with the same base model, target and config against the *current* pool (so without withdrawn
    items). The new job records ``parent_id``."""
    from t3ar.method.config import AdaptConfig

    orig = require_job(state.store, job_id)
    require_model(state.store, state.settings, orig.model_id)
    if not (state.settings.data_dir / orig.target_dir).is_dir():
        raise ConflictError(f"the target images of job {job_id} are no longer stored; submit them again")
    cfg = AdaptConfig.model_validate(orig.config)
    _check_size(state, cfg, kept_images(orig.n_images, cfg.fraction), orig.model_id)  # the caps may have changed
    _check_pool(state, cfg)
    secret, digest = new_job_secret()
    row = JobRow(id=uuid.uuid4().hex, model_id=orig.model_id, parent_id=orig.id, created_at=_now(),
                 config=orig.config, target_dir=orig.target_dir, n_images=orig.n_images, labelled=orig.labelled,
                 skipped=orig.skipped, secret_sha256=digest)
    state.store.add_job(row)
    try:
        return _accepted(request, state, row, [], secret)
    except BaseException:
        state.store.delete_job(row.id)
        raise

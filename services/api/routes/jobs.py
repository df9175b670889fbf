"""Adaptation jobs: submit (validated before enqueueing), list, describe, cancel, download, report, readapt
(:mod:`t3ar_services.api.domain.jobs`).

Blocking work (extraction, image decoding, Redis) runs in sync ``def`` routes, i.e. FastAPI's thread pool.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, File, Form, Query, UploadFile
from fastapi.responses import FileResponse, JSONResponse

from t3ar_services.api import schemas as s
from t3ar_services.api.deps import SUBMIT, USER, ClientDep, LinksDep, PrincipalDep, StateDep, SubmitterDep
from t3ar_services.api.domain import Links, access, exports, jobs
from t3ar_services.common.body_limit import body_size
from t3ar_services.common.forms import only_fields

# What JSON Schema cannot state about the upload, named in the document: the archive part is one of these
# archive types (of readable images), and `config` is a JSON object of valid AdaptConfig options.
ARCHIVE_MEDIA_TYPES = ("application/zip", "application/x-tar", "application/gzip")
ADAPT_CONFIG_FORMAT = "t3ar-adapt-config"

router = APIRouter(responses=s.error_responses(401, 403, 404, 409, 413, 422, 503), dependencies=USER, tags=["jobs"])


def _accepted(links: Links, done: jobs.Accepted) -> JSONResponse:
    row = done.row
    url = links("get_job", row.id)
    body = s.JobAccepted(id=row.id, url=url, parent_id=row.parent_id, config=done.config,
                         target=s.TargetInfo(images=row.n_images, labelled=row.labelled, skipped=row.skipped),
                         contribute=done.contribute, warnings=done.warnings)
    return JSONResponse(body.model_dump(), status_code=202, headers={"Location": url})


@router.post("/adapt", status_code=202, response_model=s.JobAccepted,
              dependencies=[body_size("archive"),
                            only_fields("archive", "model_id", "config", "skip_bad_images", "contribute", "holdout",
                                        "candidates", "require_gain", "winner_rule", "register_as",
                                        "register_alias")],
              responses={400: {"model": s.ErrorBody, "description": "unparsable multipart body"}},
              openapi_extra={"requestBody": {"content": {"multipart/form-data": {"encoding": {
                  "archive": {"contentType": ", ".join(ARCHIVE_MEDIA_TYPES)}}}}}})
def adapt(
    state: StateDep, links: LinksDep, who: SubmitterDep, client: ClientDep,
    archive: Annotated[UploadFile, File(description="zip/tar(.gz) of target images; labels.csv (path,label) at "
                                                    "its root switches to train-time mode")],
    model_id: Annotated[str, Form(min_length=1, description="a base model id from POST /models")],
    config: Annotated[str, Form(description="JSON object of the options of its method's config (contentSchema: "
                                            "AdaptConfig, one schema per method), e.g. "
                                            "{\"method\": \"t3ar\", \"k\": 5, \"epochs\": 2}",
                                json_schema_extra={"format": ADAPT_CONFIG_FORMAT})] = "{}",
    skip_bad_images: Annotated[bool, Form(description="drop unreadable files instead of refusing it")] = False,
    contribute: Annotated[bool, Form(description="once the job finished successfully, add its target images to "
                                                 "the pool (source target:<job id>; exact and near-duplicates of "
                                                 "pool items skipped); off by default")] = False,
    holdout: Annotated[UploadFile | None, File(description="an acceptance holdout: a few labelled images of the "
                                                           "target (class folders, or images and labels.csv, as a "
                                                           "zip/tar), never trained on; the job scores its "
                                                           "candidates on it and returns the winner")] = None,
    candidates: Annotated[str, Form(description="with a holdout: the methods to score, comma-separated (default: "
                                                "source, bn-adapt and the job's method)")] = "",
    require_gain: Annotated[bool, Form(description="with a holdout: fail the job when no candidate beats the base "
                                                   "model (source)")] = False,
    winner_rule: Annotated[str, Form(description="with a holdout: 'argmax' (the best holdout top-1, a tie to the "
                                                 "simpler; default) or 'paired' (the simpler candidate unless a "
                                                 "paired 95 % CI favours another)")] = "",
    register_as: Annotated[str, Form(max_length=100, description="with an MLflow registry (T3AR_MLFLOW_TRACKING_URI):"
                                     " the registered model's name, in your team's namespace (<team>.<name>; "
                                     "default t3ar-<base model's name>)")] = "",
    register_alias: Annotated[str, Form(max_length=64, description="with an MLflow registry: the alias the finished "
                                        "job's version gets (e.g. challenger); none unless named here")] = "",
) -> JSONResponse:
    """Validate the target (safe extraction, every image readable, labels known to the model, options valid,
    pool large enough) and enqueue an adaptation job. Nothing is enqueued when any check fails (4xx).
    With ``contribute=true`` the target joins the pool once the job finished (never when it fails or is
    canceled); withdraw it as one unit with ``DELETE /jobs/{id}/contribution`` (admin). With a ``holdout`` (checked:
    labels of the model, an image for every class it names, no image of the target, at most
    ``T3AR_API_MAX_HOLDOUT_IMAGES``) the job scores its candidates on it and returns the winner; its report's
    ``acceptance`` says which and why."""
    upload = jobs.TargetUpload(archive.file, archive.filename, model_id, config, skip_bad_images, contribute,
                               holdout.file if holdout is not None else None,
                               holdout.filename if holdout is not None else None, candidates, require_gain,
                               winner_rule, register_as, register_alias)
    with access.refusals_recorded(state, who, "job.submit", client):
        model = access.check_model(state, who, model_id)
        done = jobs.submit(state, upload, access.owner(who), model)
    access.record(state, who, "job.submit", done.row.id, client, detail=f"model={model_id}")
    return _accepted(links, done)


@router.get("/jobs", response_model=s.JobList)
def list_jobs(state: StateDep, links: LinksDep, who: PrincipalDep,
              limit: Annotated[int, Query(ge=1, le=200)] = 50, before: str | None = None) -> s.JobList:
    """Your team's jobs (an admin's: every team's), newest first. Page with ``before`` = the previous page's
    ``next_before``."""
    if before is not None:
        access.job_for(state, who, before)
    found = jobs.list_jobs(state, links, limit, before, who.team_filter)
    return found.model_copy(update={"jobs": [access.visible_job(state, who, j) for j in found.jobs]})


@router.get("/jobs/{job_id}", response_model=s.JobOut)
def get_job(state: StateDep, links: LinksDep, who: PrincipalDep, job_id: str) -> s.JobOut:
    """Status, progress (epoch, step, losses, pseudo-label change rate), timings, and the error when failed.
    Another team's job is a 404, as an unknown one."""
    access.job_for(state, who, job_id)
    return access.visible_job(state, who, jobs.describe(state, links, job_id))


@router.post("/jobs/{job_id}/cancel", response_model=s.CancelResponse, dependencies=SUBMIT)
def cancel_job(state: StateDep, who: PrincipalDep, client: ClientDep, job_id: str) -> s.CancelResponse:
    """A queued job is canceled at once; a running one stops at its next step (status ``canceling`` until then)."""
    access.job_for(state, who, job_id)
    status = jobs.cancel(state, job_id)
    access.record(state, who, "job.cancel", job_id, client, detail=status)
    return s.CancelResponse(id=job_id, status=status)  # type: ignore[arg-type]


@router.get("/jobs/{job_id}/checkpoint", response_class=FileResponse,
            responses={200: {"content": {"application/octet-stream": {}},
                             "headers": {"X-Checksum-Sha256": {"schema": {"type": "string"}, "description":
                                         "the file's sha256 (an export's; also in the job's `exports`)"}}}})
def get_checkpoint(state: StateDep, who: PrincipalDep, client: ClientDep, job_id: str, fmt: Annotated[
        Literal["pt", "onnx", "safetensors"], Query(alias="format", description=(
            "pt: the t3ar checkpoint (load with t3ar.models.checkpoint.load_checkpoint); onnx: the whole "
            "classifier, uint8 NHWC RGB images in (preprocessing inside), logits out, classes and lineage in its "
            "metadata; safetensors: the weights with spec and lineage as header metadata (t3ar loads it too). "
            "An export is made on its first request (checked for parity on the job's target images), kept, and "
            "its sha256 recorded in the job's `exports`."))] = "pt") -> FileResponse:
    """The adapted checkpoint, as it is or exported for serving (``?format=onnx|safetensors``)."""
    access.job_for(state, who, job_id)
    got = exports.download(state, job_id, fmt)
    access.record(state, who, "job.download", job_id, client, detail=f"format={fmt}")
    headers = {"X-Checksum-Sha256": got.sha256} if got.sha256 else None
    return FileResponse(got.path, media_type=got.media_type, filename=got.filename, headers=headers)


@router.get("/jobs/{job_id}/report", response_model=s.ReportOut, response_model_exclude_unset=True)
def get_report(state: StateDep, who: PrincipalDep, job_id: str) -> s.ReportOut:
    """Metrics of the run: steps, timings, per-epoch losses, pool items used; accuracy when labels were given;
    ``contribution`` (whether its target joined the pool: added / skipped counts) and
    ``neighbours_from_contributions`` (earlier jobs' contributions its retrieved neighbours came from). The
    fields are the report's as stored."""
    access.job_for(state, who, job_id)
    found = jobs.report(state, job_id)
    return found.model_copy(update={"neighbours_from_contributions": access.visible_neighbours(
        state, who, found.neighbours_from_contributions)})


@router.post("/jobs/{job_id}/registration", response_model=s.Registration, dependencies=SUBMIT)
def retry_registration(state: StateDep, who: PrincipalDep, client: ClientDep, job_id: str) -> s.Registration:
    """Try a failed MLflow registration again (its attempts start from zero); 409 unless it failed, 404 when the
    job has none (the API registers none, or the job predates it)."""
    access.job_for(state, who, job_id)
    out = jobs.retry_registration(state, job_id)
    access.record(state, who, "job.registration", job_id, client, detail="retry")
    return out


@router.post("/jobs/{job_id}/readapt", status_code=202, response_model=s.JobAccepted, dependencies=SUBMIT)
def readapt(state: StateDep, links: LinksDep, who: PrincipalDep, client: ClientDep, job_id: str) -> JSONResponse:
    """Re-run a job with the same base model, target and config against the *current* pool (so without withdrawn
    items). The new job records ``parent_id`` and belongs to the team of the job it re-runs."""
    access.job_for(state, who, job_id)
    done = jobs.readapt(state, job_id, who.key_id)
    access.record(state, who, "job.readapt", done.row.id, client, detail=f"parent={job_id}")
    return _accepted(links, done)

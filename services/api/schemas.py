"""Request and response bodies of the adaptation API (the OpenAPI schema at /docs is generated from these)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from t3ar.clients.api_models import Progress
from t3ar_services.common.job_contract import AcceptanceRecord, JobReport
from t3ar_services.common.text import Utf8Str

JobStatusName = Literal["queued", "started", "finished", "failed", "canceled"]


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` of a router whose errors are these statuses, each with the error body."""
    return {c: {"model": ErrorBody} for c in codes}


class ErrorInfo(BaseModel):
    code: str = Field(description="machine-readable: not_found, invalid_input, bad_image, unsafe_archive, "
                      "bad_checkpoint, export_failed, payload_too_large, unauthorized, forbidden, conflict, "
                      "unavailable, retriever_unavailable, retriever_rejected, retriever_auth, invalid_request, "
                      "internal")
    message: str = Field(description="what went wrong and what to do about it")


class ErrorBody(BaseModel):
    error: ErrorInfo


class HealthResponse(BaseModel):
    status: Literal["ok"] = "ok"


class ReadyResponse(BaseModel):
    ready: bool
    redis: bool
    retriever: bool
    workers: int = Field(description="rq workers listening on the adaptation queue")
    detail: str | None = None


class ModelOut(BaseModel):
    id: str
    name: str
    sha256: str
    size: int
    arch: str
    image_size: int
    num_classes: int
    classes: list[str]
    uploaded_at: str


class ModelList(BaseModel):
    models: list[ModelOut]


class TargetInfo(BaseModel):
    images: int
    labelled: bool
    skipped: int = Field(description="unreadable files dropped (only with skip_bad_images=true)")


class Contribution(BaseModel):
    """A job's contribution of its target images to the pool (``contribute=true`` on POST /adapt)."""

    requested: bool
    status: Literal["not_requested", "waiting", "pending", "done", "none", "withdrawing", "withdrawn"] = Field(
        description="not_requested; waiting (the job has not finished); pending (finished, being added); done; "
                    "none (the job failed or was canceled: nothing contributed); withdrawing; withdrawn")
    source: str | None = Field(default=None, description="the pool source of its items: target:<job id>")
    images: int | None = Field(default=None, description="target images offered")
    added: int | None = Field(default=None, description="images that joined the pool")
    skipped_exact: int | None = Field(default=None, description="skipped: the same file (sha256) was in the pool")
    skipped_near: int | None = Field(default=None, description="skipped: R's near-duplicate of a pool item (cosine "
                                                               ">= the pool's duplicate_threshold)")
    rejected: int | None = None
    attempts: int | None = Field(default=None, description="failed attempts so far (retried)")
    error: str | None = None
    withdrawn_at: str | None = None
    withdrawn_items: int | None = None


class NeighbourSource(BaseModel):
    job_id: str = Field(description="the job whose contribution it is")
    source: str
    items_used: int = Field(description="of its items, how many this job retrieved and used")


class ReportOut(JobReport):
    """A finished job's report as ``GET /jobs/{id}/report`` serves it: what the worker reported, and what the API
    knows now (not at finishing)."""

    contribution: Contribution = Field(description="whether this job's target joined the pool, and how it went")
    neighbours_from_contributions: list[NeighbourSource] = Field(
        default_factory=list, description="earlier jobs' contributions its retrieved neighbours came from")


class ExportParity(BaseModel):
    """The check an export passed before it was kept: the exported model against the checkpoint."""

    images: int
    images_source: str = Field(description="which images: the job's target (topped up with generated ones)")
    max_abs_diff: float = Field(description="largest |logit difference| over those images")
    top1_agreement: float = Field(description="share of the images with the same top-1 class (1.0 = all)")
    tolerance: float
    ok: bool


class ExportOut(BaseModel):
    """A finished job's checkpoint in a serving format, made on its first download and kept."""

    format: Literal["onnx", "safetensors"]
    url: str
    sha256: str
    size: int
    created_at: str
    parity: ExportParity


class JobOut(BaseModel):
    id: str
    url: str
    status: JobStatusName
    model_id: str
    parent_id: str | None = Field(default=None, description="the job this one re-runs (readapt)")
    created_at: str
    enqueued_at: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    queue_position: int | None = None
    worker: str | None = None
    config: dict[str, Any]
    target: TargetInfo
    progress: Progress | None = None
    error: str | None = None
    result: dict[str, Any] | None = None
    checkpoint_url: str | None = None
    report_url: str | None = None
    exports: dict[str, ExportOut] = Field(
        default_factory=dict, description="the serving formats made so far, by format: `checkpoint_url` with "
                                          "`?format=onnx` or `?format=safetensors` makes one on first request")
    contribution: Contribution = Field(description="whether this job's target joins the pool, and how it went")
    neighbours_from_contributions: list[NeighbourSource] = Field(
        default_factory=list, description="earlier jobs' contributions that this job's retrieved neighbours came "
                                          "from (finished jobs; from its lineage)")
    acceptance: AcceptanceRecord | None = Field(
        default=None, description="a job with a holdout, once its candidates were scored: each candidate's top-1 with "
                                  "its 95 % CI and paired differences to the base model and bn-adapt (points), the "
                                  "rule and the winner (the job's checkpoint; with require_gain a base-model winner "
                                  "fails the job)")


class JobAccepted(BaseModel):
    id: str
    url: str
    status: JobStatusName = "queued"
    parent_id: str | None = None
    config: dict[str, Any]
    target: TargetInfo
    contribute: bool = Field(default=False, description="the target joins the pool once the job finished")
    warnings: list[str] = Field(default_factory=list)


class JobList(BaseModel):
    jobs: list[JobOut]
    total: int
    next_before: str | None = Field(default=None, description="pass as ?before= for the next (older) page")


class CancelResponse(BaseModel):
    id: str
    status: Literal["canceled", "canceling"]


class LineageJob(BaseModel):
    job_id: str
    url: str
    checkpoint_url: str
    readapt_url: str
    model_id: str | None = None
    finished_at: str | None = None


class LineageResponse(BaseModel):
    pool_id: str
    jobs: list[LineageJob] = Field(description="finished jobs whose adaptation retrieved this pool item")
    in_flight: list[str] = Field(default_factory=list,
                                 description="jobs running now; they may have retrieved it already")


class DeleteResponse(LineageResponse):
    deleted: bool = True
    lineage_error: str | None = Field(default=None, description="set when the item was withdrawn but its lineage "
                                                                "could not be read (then ``jobs`` may be incomplete)")


# --- worker routes (/internal/...; the worker token) ---------------------------------------------------------
SHA256 = r"^[0-9a-f]{64}$"


class WorkerPing(BaseModel):
    ok: Literal[True] = True
    queue: str = Field(description="the queue this API enqueues on (the worker's T3AR_WORKER_QUEUE must match)")


class CheckpointStored(BaseModel):
    job_id: str
    sha256: str
    size: int = Field(description="bytes received (0 when the job was already finished with this checkpoint)")
    stored: bool = Field(description="false: the job was already finished with this very checkpoint (a retry)")


class WorkerLineage(BaseModel):
    """lineage.json: the checkpoint the job made and the pool ids it retrieved (plus the Lineage fields, which
    must be the ones inside the uploaded checkpoint); its ``job_id`` is the one in the path, whatever the body
    says."""

    model_config = ConfigDict(extra="allow")

    checkpoint_sha256: str = Field(pattern=SHA256)
    pool_ids: list[Utf8Str] = Field(default_factory=list)
    job_id: Utf8Str | None = None
    model_id: Utf8Str | None = None
    parent_id: Utf8Str | None = None
    base_model_sha256: str | None = Field(default=None, pattern=SHA256)
    target_sha256: str | None = Field(default=None, pattern=SHA256)
    target_size: int | None = Field(default=None, ge=0, le=2**53)
    retriever: Utf8Str | None = None
    method: Utf8Str | None = None
    created_at: Utf8Str | None = Field(default=None, max_length=64, description="ISO 8601 time")


class WorkerResult(BaseModel):
    report: JobReport = Field(description="the job's report (a versioned model of the job contract); refused (422) "
                                          "unless it fits")
    lineage: WorkerLineage


class ResultStored(BaseModel):
    job_id: str
    status: Literal["finished"] = "finished"
    stored: bool = Field(description="false: the job was already finished with this result's checkpoint (a retry)")


# --- contributions and compaction (admin) ----------------------------------------------------------------------
class ContributionWithdrawn(BaseModel):
    job_id: str
    source: str
    withdrawn: list[str] = Field(description="the pool ids of the contribution this withdrawal deleted (not those "
                                             "removed before, e.g. by compaction)")
    jobs: list[LineageJob] = Field(description="finished jobs that retrieved any of them: readapt them")
    in_flight: list[str] = Field(default_factory=list, description="jobs running now; they may have used them")


SourcePattern = Annotated[str, Field(min_length=1, max_length=201, pattern=r"^[^\x00-\x1f]+$")]


class CompactRequest(BaseModel):
    """A dry-run (``threshold`` and ``sources``; ``dry_run`` true or absent) or a real run (``dry_run`` false and
    the dry-run's ``plan_id``, nothing else to choose)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"oneOf": [
        {"required": ["threshold", "sources"],
         "properties": {"dry_run": {"const": True}, "plan_id": {"type": "null"},
                        "threshold": {"type": "number"}, "sources": {"type": "array"}}},
        {"required": ["dry_run", "plan_id"],
         "properties": {"dry_run": {"const": False}, "plan_id": {"type": "string"},
                        "threshold": {"type": "null"}, "sources": {"type": "null"}}}]})

    dry_run: bool = Field(default=True, description="true: list what would be removed (a plan), change nothing; "
                                                    "false: apply plan_id, removing exactly what it listed")
    threshold: float | None = Field(default=None, gt=0, le=1, description="dry-run: cosine (R) at or above which "
                                                                          "two items are near-duplicates, (0, 1]")
    sources: list[SourcePattern] | None = Field(default=None, min_length=1, max_length=100,
                                      description="dry-run: sources whose items may be removed (a trailing * "
                                                  "matches a prefix: target:*)")
    nprobe: int = Field(default=2, ge=1, le=1024, description="IVF cells probed per item above 20k items")
    plan_id: str | None = Field(default=None, max_length=64, description="real run: the dry-run's plan_id")


class CompactRemoval(BaseModel):
    id: str
    source: str
    size: int
    duplicate_of: str
    score: float


class CompactResponse(BaseModel):
    dry_run: bool
    plan_id: str
    threshold: float
    sources: list[str]
    remove: list[CompactRemoval] = Field(description="dry-run: what the plan removes; real run: what it removed")
    bytes_freed: int = Field(description="image bytes the removals free (dry-run: would free)")
    clusters: int | None = None
    scanned: int | None = None
    items: int | None = None
    method: str | None = None
    seconds: dict[str, float] = Field(default_factory=dict)
    jobs: list[LineageJob] = Field(default_factory=list, description="real run: finished jobs that used a removed "
                                                                     "item")
    in_flight: list[str] = Field(default_factory=list)

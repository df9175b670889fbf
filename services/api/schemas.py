"""Request and response bodies of the adaptation API (the OpenAPI schema at /docs is generated from these)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from t3ar_services.common.text import Utf8Str

JobStatusName = Literal["queued", "started", "finished", "failed", "canceled"]


class ErrorInfo(BaseModel):
    code: str = Field(description="machine-readable: not_found, invalid_input, bad_image, unsafe_archive, "
                      "bad_checkpoint, payload_too_large, unauthorized, forbidden, conflict, unavailable, "
                      "retriever_unavailable, retriever_rejected, retriever_auth, invalid_request, internal")
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


class Progress(BaseModel):
    phase: str | None = Field(default=None, description="starting, loading, retrieving, adapting, saving, done")
    epoch: int | None = None
    epochs: int | None = None
    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    loss_ce: float | None = None
    loss_contrastive: float | None = None
    pl_change_rate: float | None = Field(default=None, description="share of pseudo-labels that changed")
    lr: float | None = None
    device: str | None = None
    host: str | None = Field(default=None, description="machine running the job")
    pid: int | None = Field(default=None, description="process running the job")
    updated_at: str | None = None


class TargetInfo(BaseModel):
    images: int
    labelled: bool
    skipped: int = Field(description="unreadable files dropped (only with skip_bad_images=true)")


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


class JobAccepted(BaseModel):
    id: str
    url: str
    status: JobStatusName = "queued"
    parent_id: str | None = None
    config: dict[str, Any]
    target: TargetInfo
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
    report: dict[str, Any] = Field(description="report.json, as GET /jobs/{id}/report serves it")
    lineage: WorkerLineage


class ResultStored(BaseModel):
    job_id: str
    status: Literal["finished"] = "finished"
    stored: bool = Field(description="false: the job was already finished with this result's checkpoint (a retry)")

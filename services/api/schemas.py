"""Request and response bodies of the adaptation API (the OpenAPI schema at /docs is generated from these); the
answers a client reads live in :mod:`t3ar.clients.api_models`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from t3ar.clients.api_models import (
    CancelResponse,
    CompactRemoval,
    CompactResponse,
    Contribution,
    ContributionWithdrawn,
    DeleteResponse,
    ExportOut,
    ExportParity,
    JobAccepted,
    JobConfig,
    JobList,
    JobOut,
    JobResult,
    JobStatusName,
    LineageJob,
    LineageResponse,
    ModelList,
    ModelOut,
    NeighbourSource,
    Progress,
    ReadyResponse,
    Registration,
    ReportOut,
    StoredConfig,
    TargetInfo,
    job_config,
)
from t3ar_services.common.job_contract import AcceptanceRecord, JobReport
from t3ar_services.common.text import Utf8Str

# the API's answers are models of the library (t3ar.clients.api_models), which the CLI's client returns
__all__ = ["CancelResponse", "CompactRemoval", "CompactResponse", "Contribution", "ContributionWithdrawn",
           "DeleteResponse", "ExportOut", "ExportParity", "JobAccepted", "JobConfig", "JobList", "JobOut",
           "JobResult", "JobStatusName", "LineageJob", "LineageResponse", "ModelList", "ModelOut", "NeighbourSource",
           "Progress", "ReadyResponse", "Registration", "ReportOut", "StoredConfig", "TargetInfo", "AcceptanceRecord",
           "job_config"]


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


class ReadmitResponse(BaseModel):
    """A withdrawal lifted: the content of ``pool_id`` may be added to the pool again (as a new item)."""

    pool_id: str
    sha256: str = Field(description="the digest of the withdrawn image's bytes")
    withdrawn_at: str = Field(description="when it was withdrawn (ISO 8601, UTC)")
    readmitted: bool = True


class HealthResponse(BaseModel):
    status: Literal["ok"] = "ok"


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



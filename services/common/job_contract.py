"""The job contract between the API (producer) and the workers (consumers): queue, job function and
arguments, Redis keys, the worker routes of the API and the artifact layout. No torch, no settings: both sides
import this, neither imports the other.

Storage: only the API has a data directory of jobs; a worker shares nothing with it but Redis. A job names its
inputs by sha256 and the worker moves bytes over HTTP with the API's worker token (``T3AR_API_WORKER_TOKEN``):

- ``GET`` :data:`TARGET_ROUTE`: the validated target as one tar (images + labels.csv), sha256 ``target_sha256``;
- ``GET`` :data:`BASE_MODEL_ROUTE`: the base checkpoint, sha256 ``model_sha256``;
- ``GET`` :data:`HOLDOUT_ROUTE`: a job's acceptance holdout as one tar (class folders, or images + labels.csv),
  sha256 ``holdout_sha256``; only a job with ``acceptance`` set has one;
- ``PUT`` :data:`CHECKPOINT_ROUTE` ``?sha256=``: the adapted checkpoint, streamed; the API verifies the digest
  and renames it into place;
- ``PUT`` :data:`RESULT_ROUTE`: the report (a :class:`JobReport`) and lineage (JSON, naming the checkpoint's
  sha256); the API validates both and writes them last, which finishes the job. A finished job's artifacts are
  never replaced: the same upload again answers 200 (a retry), a different one 409.

Each of a job's routes also needs the job's own secret (:data:`JOB_SECRET_HEADER`), which travels only in the
job's payload (``JobSpec.job_secret``; the API keeps its sha256): the worker token opens the worker routes,
the secret binds them to the job the worker dequeued.

The API's data directory::

    <data_dir>/models/<model_id>.pt         base checkpoints (uploaded through the API)
    <data_dir>/jobs/<job_id>/target/        the validated, extracted target images (+ labels.csv)
    <data_dir>/jobs/<job_id>/target.tar     the same, as the one file workers download (made at enqueue)
    <data_dir>/jobs/<job_id>/subsample.json the target images the job adapts to (rows and their digest, drawn once
                                            at submission; the job spec carries them)
    <data_dir>/artifacts/<job_id>/model.pt  the adapted checkpoint (uploaded by the worker; atomic rename)
    <data_dir>/artifacts/<job_id>/report.json
    <data_dir>/artifacts/<job_id>/lineage.json   written last: its presence means "finished"
"""

from __future__ import annotations

import hashlib
import json
import secrets
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from t3ar.acceptance_options import AcceptanceOptions
from t3ar.clients.api_models import JobResult, Progress, read_leniently
from t3ar.clients.job_report import (
    MAX_LABELLED_LISTED,
    REPORT_VERSION,
    AcceptanceRecord,
    Accuracy,
    CacheStats,
    EpochPoint,
    EvalBrief,
    JobReport,
    LabelledNeighbour,
    Neighbour,
    NeighbourQualityRecord,
    NeighbourRow,
    StepPoint,
    Transfer,
)
from t3ar.method.config import AdaptConfig
from t3ar_services.common.files import atomic_file

# The job's report (``PUT`` :data:`RESULT_ROUTE` carries it; the API validates it there): a versioned model defined
# in the library, which the CLI reads too (the library never imports the services).
__all__ = ["REPORT_VERSION", "AcceptanceRecord", "Accuracy", "CacheStats", "EpochPoint", "EvalBrief", "JobReport",
           "JobResult", "LabelledNeighbour", "MAX_LABELLED_LISTED", "Neighbour", "NeighbourQualityRecord",
           "NeighbourRow", "Progress", "StepPoint", "Transfer"]

DEFAULT_QUEUE = "t3ar-adapt"
JOB_FUNCTION = "t3ar_services.worker.jobs.run_adapt_job"
SERIALIZER = "rq.serializers.JSONSerializer"  # JSON-able arguments, meta and results only; no pickle

CANCEL_KEY = "t3ar:cancel:{job_id}"  # set by the API; polled by the job between steps
# withdrawn pool ids, which workers drop from their image caches: the bounded feed of t3ar_services.common.withdrawn

WORKER_PREFIX = "/internal/"  # every worker route is under it
TARGET_ROUTE = "/internal/jobs/{job_id}/target"
BASE_MODEL_ROUTE = "/internal/jobs/{job_id}/base-model"
HOLDOUT_ROUTE = "/internal/jobs/{job_id}/holdout"
CHECKPOINT_ROUTE = "/internal/jobs/{job_id}/checkpoint"
RESULT_ROUTE = "/internal/jobs/{job_id}/result"
PING_ROUTE = "/internal/ping"
#: the header carrying a job's own secret on its worker routes (see :class:`JobSpec`)
JOB_SECRET_HEADER = "X-T3AR-Job-Secret"

MODEL_FILE = "model.pt"
REPORT_FILE = "report.json"
LINEAGE_FILE = "lineage.json"


SHA256_PATTERN = r"^[0-9a-f]{64}$"
class JobSpec(BaseModel):
    """The single (JSON) argument of :func:`t3ar_services.worker.jobs.run_adapt_job`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    model_id: str
    model_sha256: str = Field(pattern=SHA256_PATTERN, description="the base checkpoint file's sha256")
    target_sha256: str = Field(pattern=SHA256_PATTERN, description="the target tar's sha256")
    target_bytes: int = Field(ge=0, description="the target tar's size")
    config: AdaptConfig = Field(description="the job's adaptation config: the registered methods' configs, "
                                            "discriminated on method (t3ar.method.config)")
    subsample_rows: list[int] = Field(
        min_length=2, description="the target images the job adapts to, as indices in the target's order "
                                  "(t3ar.data.target.read_target): the subsample of the config's fraction and seed, "
                                  "drawn once at submission")
    subsample_sha256: str = Field(pattern=SHA256_PATTERN, description="the digest of those images "
                                                                      "(t3ar.pipeline.imageset_sha256): the "
                                                                      "target_sha256 its checkpoint's lineage names")
    parent_id: str | None = Field(default=None, description="the job this one re-runs (readapt)")
    request_id: str | None = Field(default=None, max_length=128,
                                   description="the API request that made the job: in the worker's log lines and "
                                               "its calls to the retriever")
    job_secret: str = Field(min_length=32, max_length=128,
                            description="the job's own secret: its worker routes need it (header X-T3AR-Job-Secret) "
                                        "besides the worker token, so a worker token alone cannot read another "
                                        "job's inputs or replace its result")
    acceptance: AcceptanceOptions | None = Field(
        default=None, description="the job's acceptance options: candidates scored on its holdout, the winner "
                                  "returned; None = no holdout")
    holdout_sha256: str | None = Field(default=None, pattern=SHA256_PATTERN,
                                       description="the holdout tar's sha256 (with acceptance)")
    holdout_bytes: int | None = Field(default=None, ge=0, description="the holdout tar's size")


class JobMeta(Progress):
    """An adaptation job's rq ``job.meta``: written by the worker running it (the API never writes it), read by the
    API (``GET /jobs/{id}`` shows its :class:`Progress` part) and by the worker's metrics."""

    model_config = ConfigDict(validate_assignment=True)

    error: str | None = Field(default=None, description="a failed job: one line, what the API shows")
    canceled: bool = Field(default=False, description="the job stopped because its cancellation was requested")
    acceptance: AcceptanceRecord | None = Field(default=None, description="a job with a holdout, once its "
                                                                          "candidates were scored")
    steps: int | None = Field(default=None, description="a finished job: the optimiser steps it ran")
    seconds_adapt: float | None = Field(default=None, description="a finished job: seconds of adaptation")

    @classmethod
    def read(cls, meta: dict[str, Any] | None) -> JobMeta:
        """``meta`` as written; a field that does not fit the contract is left out (a job's answer never fails on
        what a worker wrote)."""
        return read_leniently(cls, dict(meta or {}), "a job's meta")

    def progress(self) -> Progress | None:
        """The progress part, or None before the worker wrote any."""
        fields = self.model_dump(include=set(Progress.model_fields), exclude_none=True)
        return Progress.model_validate(fields) if fields else None

    def dump(self) -> dict[str, Any]:
        """What goes into ``job.meta`` (JSON, unset fields left out)."""
        return self.model_dump(mode="json", exclude_none=True, exclude_defaults=True)


def new_job_secret() -> tuple[str, str]:
    """A fresh job secret and its sha256 (the API keeps only the digest)."""
    secret = secrets.token_urlsafe(32)
    return secret, secret_digest(secret)


def secret_digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "replace")).hexdigest()


class JobCanceledError(Exception):
    """Raised inside a job when its cancellation was requested; the job ends without an artifact."""


def artifacts_dir(data_dir: Path, job_id: str) -> Path:
    return Path(data_dir) / "artifacts" / job_id


def resolve_inside(data_dir: Path, relative: str) -> Path:
    """``data_dir / relative``, refusing anything that escapes the data dir (a job spec is data, not code)."""
    base = Path(data_dir).resolve()
    path = (base / relative).resolve()
    if not path.is_relative_to(base):
        raise ValueError(f"path {relative!r} escapes the data directory")
    return path


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write JSON to a temp file in the same folder, fsync, rename: readers see the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "w", encoding="utf-8") as fh:
        json.dump(payload, fh, indent=2, default=str)

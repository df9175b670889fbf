"""The job contract between the API (producer) and the workers (consumers): queue, job function and
arguments, Redis keys, artifact layout. No torch, no settings: both sides import this, neither imports the
other.

Storage: the API and every worker see the same data directory (one disk for the embedded stack, a shared
volume / network filesystem across machines). Job arguments carry paths *relative* to it, so each machine
may mount it wherever it likes.

::

    <data_dir>/models/<model_id>.pt         base checkpoints (uploaded through the API)
    <data_dir>/jobs/<job_id>/target/        the validated, extracted target images (+ labels.csv)
    <data_dir>/artifacts/<job_id>/model.pt  the adapted checkpoint (atomic rename)
    <data_dir>/artifacts/<job_id>/report.json
    <data_dir>/artifacts/<job_id>/lineage.json   written last: its presence means "finished"
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_QUEUE = "t3ar-adapt"
JOB_FUNCTION = "t3ar_services.worker.jobs.run_adapt_job"
SERIALIZER = "rq.serializers.JSONSerializer"  # JSON-able arguments, meta and results only; no pickle

CANCEL_KEY = "t3ar:cancel:{job_id}"  # set by the API; polled by the job between steps
WITHDRAWN_KEY = "t3ar:pool:withdrawn"  # set of withdrawn pool ids; workers drop them from their image cache

MODEL_FILE = "model.pt"
REPORT_FILE = "report.json"
LINEAGE_FILE = "lineage.json"


class JobSpec(BaseModel):
    """The single (JSON) argument of :func:`t3ar_services.worker.jobs.run_adapt_job`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    model_id: str
    model_path: str = Field(description="base checkpoint, relative to the data dir")
    target_dir: str = Field(description="extracted target images, relative to the data dir")
    config: dict[str, Any] = Field(description="an AdaptConfig, as a dict")
    parent_id: str | None = Field(default=None, description="the job this one re-runs (readapt)")
    request_id: str | None = Field(default=None, max_length=128,
                                   description="the API request that made the job: in the worker's log lines and "
                                               "its calls to the retriever")


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
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(payload, fh, indent=2, default=str)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

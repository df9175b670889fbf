"""Worker settings: one pydantic-settings class, env prefix ``T3AR_WORKER_``, built at start-up.

A worker needs Redis (the queue), the API (``api_url`` + the API's worker token: a job's inputs and its
checkpoint travel over HTTP) and the retriever; its ``data_dir`` is its own (caches and scratch space), never the
API's.

The worker parent builds it once; the job (in the forked work-horse) builds it again from the same
environment (``t3ar worker`` exports its command-line overrides to the environment first).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from t3ar_services.common.job_contract import DEFAULT_QUEUE

GiB = 1024**3


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="T3AR_WORKER_", extra="ignore", frozen=True)

    redis_url: str = "redis://127.0.0.1:6379/0"
    queue: str = DEFAULT_QUEUE
    name: str | None = None  # rq worker name; default <hostname>.<pid>
    data_dir: Path = Path("data/worker")  # this worker's own: caches and per-job scratch space

    api_url: str = "http://127.0.0.1:8700"
    api_token: SecretStr | None = None  # the API's worker token (T3AR_API_WORKER_TOKEN)
    api_timeout: float = Field(default=120.0, gt=0, description="seconds per API read/write (not per transfer)")
    api_retries: int = Field(default=4, ge=0, le=20)

    retriever_url: str = "http://127.0.0.1:8701"
    retriever_token: SecretStr | None = None  # the retriever's read/write token
    retriever_timeout: float = Field(default=120.0, gt=0)
    retriever_retries: int = Field(default=4, ge=0, le=20)

    device: str = "auto"  # auto = CUDA when present, else CPU
    torch_threads: int | None = Field(default=None, ge=1)
    preload: bool = Field(default=True, description="import torch and the core in the parent before forking "
                                                    "work horses (imports only; see worker/preload.py)")

    cache_dir: Path | None = None  # fetched pool images; default <data_dir>/cache/pool-images
    cache_max_bytes: int = Field(default=2 * GiB, ge=0)
    model_cache_max_bytes: int = Field(default=8 * GiB, ge=0, description="base checkpoints kept by sha256 "
                                                                          "(0: fetched for every job)")

    progress_interval: float = Field(default=0.5, gt=0, description="min seconds between job.meta writes")
    monitor_interval: int = Field(default=10, ge=1, description="seconds between the parent's heartbeats")
    abandon_grace: int = Field(default=30, ge=1, description="a job with no heartbeat for interval+grace s "
                                                             "is failed as abandoned")
    log_level: str = "INFO"
    metrics_port: int | None = Field(default=None, ge=0, le=65535,
                                     description="serve Prometheus /metrics on this port (unset or 0: off)")
    metrics_host: str = "127.0.0.1"

    def image_cache_dir(self) -> Path:
        return self.cache_dir if self.cache_dir is not None else self.data_dir / "cache" / "pool-images"

    def model_cache_dir(self) -> Path:
        return self.data_dir / "cache" / "models"

    def work_dir(self) -> Path:
        """Per-job scratch space (the downloaded target, the checkpoint before upload); emptied after each job."""
        return self.data_dir / "work"

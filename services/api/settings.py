"""API settings: one pydantic-settings class, env prefix ``T3AR_API_``, built at start-up (never at import).

Every field is documented in ``services/api/README.md``; keep the two in sync.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from t3ar_services.common.job_contract import DEFAULT_QUEUE
from t3ar_services.common.settings import ServiceSettings

MiB = 1024**2
DAY = 86400


class ApiSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="T3AR_API_", extra="ignore", frozen=True)

    data_dir: Path = Path("data/api")
    redis_url: str = "redis://127.0.0.1:6379/0"
    queue: str = DEFAULT_QUEUE

    # --- auth (ServiceSettings): token = the user token (adapt, read, cancel, readapt, upload models),
    # admin_token = everything, plus DELETE /pool/{id}; auth_disabled ---
    worker_token: SecretStr | None = None  # the workers' token: the /internal routes only (and nothing else does)

    # --- the retriever (pool) ---
    retriever_url: str = "http://127.0.0.1:8701"
    retriever_token: SecretStr | None = None  # read/write token: pool size checks before enqueueing
    retriever_admin_token: SecretStr | None = None  # admin token: forwarded deletes
    retriever_timeout: float = Field(default=30.0, gt=0)
    compact_timeout: float = Field(default=3600.0, gt=0, description="seconds a compaction dry-run's scan of the "
                                                                     "pool may take (the retriever's answer)")

    # --- jobs ---
    job_timeout: int = Field(default=6 * 3600, ge=10, description="seconds a job may run before it is killed (the "
                                                                   "per-job wall-time cap)")
    max_job_steps: int = Field(default=200_000, ge=1, description="optimiser steps one job may plan (422 above)")
    max_job_memory_bytes: int = Field(default=16 * 1024 * MiB, ge=1,
                                      description="memory of one job's bank, target and pool images (422 above)")
    max_export_memory_bytes: int = Field(default=4096 * MiB, ge=1,
                                         description="memory one checkpoint export (ONNX, safetensors) may take in "
                                                     "the API process, as estimated before it starts (422 above)")
    result_ttl: int = Field(default=30 * DAY, ge=60, description="seconds Redis keeps a finished job's record")
    failure_ttl: int = Field(default=30 * DAY, ge=60, description="seconds Redis keeps a failed job's record")
    sweep_interval: float = Field(default=5.0, gt=0, description="seconds between abandoned-job / lineage sweeps")

    # --- limits ---
    max_upload_bytes: int = Field(default=1024 * MiB, ge=1, description="target archive, as uploaded")
    max_model_bytes: int = Field(default=1024 * MiB, ge=1, description="base checkpoint upload")
    max_ingest_bytes: int = Field(default=128 * MiB, ge=1,
                                  description="the console's pool ingest (held in the API's memory while the "
                                              "retriever takes it); larger sets: t3ar pool ingest")
    max_result_bytes: int = Field(default=64 * MiB, ge=1024, description="a worker's result (report and lineage) "
                                                                        "JSON, read after the job's secret")
    max_archive_files: int = Field(default=50_000, ge=1)
    max_archive_bytes: int = Field(default=4096 * MiB, ge=1, description="target archive, extracted")
    max_archive_ratio: int = Field(default=100, ge=1, description="target archive: extracted bytes per archive byte")
    max_image_bytes: int = Field(default=64 * MiB, ge=1, description="one extracted file")
    validate_threads: int = Field(default=2, ge=0, description="threads decoding images during validation")
    max_holdout_images: int = Field(default=2000, ge=1, description="images in a job's acceptance holdout (422 "
                                                                     "above); every candidate is scored on all")

    # --- links ---
    public_url: str | None = Field(default=None, description="the API's base URL as clients reach it (e.g. "
                                   "https://t3ar.example.com behind a proxy): the base of the absolute links in "
                                   "answers; unset: the scheme and address of the socket a request arrived on")

    # --- the web console (/ui) ---
    session_secret: SecretStr | None = None  # signs console sessions; unset: random per start (restart = sign-out)
    session_ttl: int = Field(default=8 * 3600, ge=60, description="seconds a console sign-in lasts")
    cookie_secure: Literal["auto", "true", "false"] = "auto"  # auto: Secure cookies when the request came over https
    console_timeout: float = Field(default=5.0, gt=0, description="seconds a console page waits for the retriever "
                                                                  "(one attempt) before its 503 names it")
    console_max_readapts: int = Field(default=20, ge=1, le=1000, description="jobs one console click re-runs "
                                      "after a withdrawal (the rest are offered again, the next click re-runs them)")

    # --- failed sign-ins (console and bearer tokens), per client address ---
    auth_failures: int = Field(default=10, ge=1, description="failed sign-ins an address may make within "
                                                             "auth_failure_window before it is answered 429")
    auth_failure_window: float = Field(default=60.0, gt=0, description="seconds a failed sign-in counts")

    # --- the audit log (an append-only table of api.sqlite3), pruned past either bound once exported ---
    audit_max_rows: int = Field(default=1_000_000, ge=100, description="audit entries kept (the oldest exported "
                                                                        "ones go first; never one not exported)")
    audit_max_age_days: float = Field(default=365.0, gt=0, description="days an exported audit entry is kept")
    audit_max_per_minute: int = Field(default=600, ge=1, description="audit entries one key writes a minute, one "
                                      "by one; past it one audit.rate_limited entry says how many were left out")

    log_level: str = "INFO"

    @model_validator(mode="after")
    def _worker_token_differs(self) -> Self:
        if self.worker_token is not None and any(
                t is not None and t.get_secret_value() == self.worker_token.get_secret_value()
                for t in (self.token, self.admin_token)):
            raise ValueError("T3AR_API_WORKER_TOKEN must differ from T3AR_API_TOKEN and T3AR_API_ADMIN_TOKEN")
        return self

    @model_validator(mode="after")
    def _session_secret_is_a_key(self) -> Self:
        if self.session_secret is not None and len(self.session_secret.get_secret_value()) < 16:
            raise ValueError("T3AR_API_SESSION_SECRET must be at least 16 characters (e.g. the output of "
                             "`openssl rand -hex 32`), or unset for a random key per start")
        return self

    @model_validator(mode="after")
    def _public_url_is_a_base(self) -> Self:
        from urllib.parse import urlsplit

        if self.public_url is not None:
            url = urlsplit(self.public_url)
            if url.scheme not in ("http", "https") or not url.hostname or url.query or url.fragment:
                raise ValueError("T3AR_API_PUBLIC_URL must be an http(s) URL with a host and no query or fragment, "
                                 f"e.g. https://t3ar.example.com or https://example.com/t3ar (got {self.public_url!r})")
        return self

    @property
    def max_body_bytes(self) -> int:
        return max(self.max_upload_bytes, self.max_model_bytes, self.max_ingest_bytes) + MiB  # + multipart overhead

"""The worker's side of the job contract (:mod:`t3ar_services.common.job_contract`): the API's worker routes.

Downloads stream into a temp file next to the destination, hashing as they go, and are renamed into place only
when the sha256 is the one the job declared (:class:`ChecksumMismatchError` otherwise: the file is deleted,
never used). A download cut short (connection lost, timeout, 502-504) starts again, up to ``retries`` times.
Every call also retries a 429 (a rate limit in front of the API) and a 503, with exponential back-off and at least
the answer's ``Retry-After`` (at most 30 s a wait), up to ``retries`` times (issue 50, N1).
Uploads stream the checkpoint from disk with its sha256 (the API verifies it and stores it atomically) and are
safe to retry: the API answers the same upload again with 200.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from t3ar.clients.api import ApiClient, ApiError, ApiUnavailableError
from t3ar.errors import T3arError
from t3ar.urls import path_segment
from t3ar_services.common.job_contract import (
    CHECKPOINT_ROUTE,
    JOB_SECRET_HEADER,
    PING_ROUTE,
    RESULT_ROUTE,
)

_RESTART = (httpx.TransportError,)  # any transport failure mid-download: the download starts over


class ChecksumMismatchError(T3arError):
    """Downloaded bytes do not have the sha256 the job declared (tampered, corrupted or replaced on the API)."""


class WorkerApiClient(ApiClient):
    """The API's worker routes, with the worker token."""

    start_hint = "is the API running and T3AR_WORKER_API_URL right?"
    retry_statuses = frozenset({429, 503})

    def bind_job(self, secret: str) -> None:
        """Show the job's own secret (from its payload) on every request from now on: the API's job routes need
        it besides the worker token."""
        self._http.headers[JOB_SECRET_HEADER] = secret

    def ping(self) -> dict[str, Any]:
        return self._json("GET", PING_ROUTE)

    def route(self, template: str, job_id: str) -> str:
        return template.format(job_id=path_segment(job_id))

    def download(self, path: str, dest: Path, sha256: str, *, what: str) -> int:
        """Stream ``GET path`` to ``dest`` (atomically) if its bytes hash to ``sha256``; the size."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(self.retries + 1):
            try:
                return self._download_once(path, dest, sha256, what)
            except (*_RESTART, ApiError) as e:
                if isinstance(e, ApiError) and not isinstance(e, ApiUnavailableError) \
                        and e.status not in self.retry_statuses:
                    raise
                if attempt == self.retries:
                    if isinstance(e, ApiError):
                        raise
                    raise ApiUnavailableError(f"{what}: download from {self.url}{path} failed {attempt + 1} time(s): "
                                              f"{type(e).__name__}: {e}") from e
                self._sleep(attempt, e.retry_after if isinstance(e, ApiError) else None, f"GET {path}",
                            type(e).__name__)
        raise AssertionError("unreachable")

    def _download_once(self, path: str, dest: Path, sha256: str, what: str) -> int:
        def check(size: int, got: str) -> None:
            if got != sha256:
                raise ChecksumMismatchError(
                    f"{what}: checksum mismatch: downloaded {size} bytes with sha256 {got}, the job says {sha256} "
                    "(the API's copy was changed or corrupted after the job was queued); the file was discarded")

        return self._download(path, dest, f"{what}: GET {path}", check)[0]

    def upload_checkpoint(self, job_id: str, path: Path, sha256: str) -> dict[str, Any]:
        """PUT the checkpoint file (streamed) with its sha256; safe to repeat."""
        with open(path, "rb") as fh:
            return self._json("PUT", self.route(CHECKPOINT_ROUTE, job_id), params={"sha256": sha256}, content=fh,
                              headers={"Content-Type": "application/octet-stream"})

    def put_result(self, job_id: str, report: dict[str, Any], lineage: dict[str, Any]) -> dict[str, Any]:
        """PUT the report and lineage: finishes the job on the API; safe to repeat."""
        return self._json("PUT", self.route(RESULT_ROUTE, job_id), json={"report": report, "lineage": lineage})

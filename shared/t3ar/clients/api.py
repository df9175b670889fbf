"""HTTP client for the adaptation API: upload a base model, submit a target, follow a job, download its
checkpoint, withdraw a pool item (getting its lineage), re-run a job. Answers come back as the API's models
(:mod:`t3ar.clients.api_models`).

Retries (:class:`~t3ar.clients.http.HttpClient`): connection failures before the request was sent and 503 are
retried for every call; read timeouts and 502/504 only for calls that are safe to repeat (GETs, model uploads,
which are idempotent by content, cancel). Submissions and deletes are not retried after the request may have
reached the server, so a job is never submitted twice. Errors come back as :class:`ApiError` subclasses that
are also core errors (a 4xx is an :class:`~t3ar.errors.InvalidInputError`), carrying the server's message.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from t3ar.clients.api_models import (
    AuditList,
    CancelResponse,
    CompactResponse,
    ContributionWithdrawn,
    DeleteResponse,
    JobAccepted,
    JobList,
    JobOut,
    KeyCreated,
    KeyList,
    KeyOut,
    LineageResponse,
    ModelList,
    ModelOut,
    ReadyResponse,
    Registration,
    ReportOut,
)
from t3ar.clients.http import HttpClient
from t3ar.errors import InvalidInputError, T3arError
from t3ar.urls import path_segment

TERMINAL = ("finished", "failed", "canceled")


class ApiError(T3arError):
    """An error answered by (or on the way to) the API; ``status`` 0 means no HTTP answer."""

    def __init__(self, message: str, *, status: int = 0, code: str = "", retry_after: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.retry_after = retry_after  # the answer's Retry-After header, if any


class ApiInputError(ApiError, InvalidInputError):
    """4xx: the request was refused (bad archive, unknown model, invalid options, job not finished...)."""


class ApiNotFoundError(ApiInputError):
    """404: unknown model, job or pool item."""


class ApiAuthError(ApiError):
    """401 (missing/invalid token) or 403 (the admin token is needed)."""


class ApiUnavailableError(ApiError):
    """The API (or Redis/the retriever behind it) could not be reached or kept failing after retries."""


def _error(resp: httpx.Response, what: str) -> ApiError:
    try:
        err = resp.json().get("error", {})
        code, message = str(err.get("code", "")), str(err.get("message", ""))
    except (ValueError, AttributeError):
        code, message = "", resp.text[:500]
    cls: type[ApiError] = ApiError
    if resp.status_code in (401, 403):
        cls = ApiAuthError
    elif resp.status_code == 404:
        cls = ApiNotFoundError
    elif 400 <= resp.status_code < 500:
        cls = ApiInputError
    elif resp.status_code in (502, 503, 504):
        cls = ApiUnavailableError
    return cls(f"{what}: {message or 'HTTP ' + str(resp.status_code)} (HTTP {resp.status_code}"
               f"{' ' + code if code else ''})", status=resp.status_code, code=code,
               retry_after=resp.headers.get("retry-after"))


def zip_folder(folder: Path, dest: Path) -> Path:
    """Zip a target folder (files only, relative names, symlinks skipped) for upload."""
    with zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_STORED) as zf:
        for p in sorted(folder.rglob("*")):
            if p.is_file() and not p.is_symlink():
                zf.write(p, p.relative_to(folder).as_posix())
    return dest


def zip_holdout(source: Path, dest: Path) -> Path:
    """A holdout ready to upload: an archive as it is, a folder of class folders (or images + labels.csv) zipped,
    a CSV of ``path,label`` zipped with its images (numbered names) and a ``labels.csv`` naming them."""
    import csv
    import io

    if source.is_dir():
        return zip_folder(source, dest)
    if source.suffix.lower() != ".csv":
        return source
    rows = io.StringIO()
    out = csv.writer(rows, lineterminator="\n")
    out.writerow(["path", "label"])
    with open(source, newline="", encoding="utf-8-sig") as fh, \
            zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_STORED) as zf:
        reader = csv.DictReader(fh)
        reader.fieldnames = [h.strip().lower() for h in reader.fieldnames or []]
        for i, row in enumerate(reader):
            rel, label = (row.get("path") or "").strip(), (row.get("label") or "").strip()
            path = Path(rel) if Path(rel).is_absolute() else source.parent / rel
            if not rel or not label or not path.is_file():
                raise InvalidInputError(f"{source.name}: row {i + 2} names no readable file ({rel!r}, {label!r})")
            name = f"{i:05d}-{path.name}"
            zf.write(path, name)
            out.writerow([name, label])
        zf.writestr("labels.csv", rows.getvalue())
    return dest


M = TypeVar("M", bound=BaseModel)


def _answer(model: type[M], data: Any) -> M:
    """``data`` (an answer's JSON) as ``model``; an answer that does not fit is an :class:`ApiError` (a client older
    or newer than its API), never a traceback."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ApiError(f"the API's answer does not fit {model.__name__} (is the client of another version than the "
                       f"API?): {e.errors()[0]['msg']} at {'.'.join(map(str, e.errors()[0]['loc']))}") from None


def _seg(value: str) -> str:
    """An id as one encoded path segment (an empty one names nothing: 404 without a request)."""
    if not value:
        raise ApiNotFoundError("an id is never empty", status=404, code="not_found")
    return path_segment(value)


class ApiClient(HttpClient):
    service = "API"
    start_hint = "is it running (t3ar up)?"
    default_timeout = 120.0
    unavailable_error = ApiUnavailableError

    def _error(self, resp: httpx.Response, what: str) -> ApiError:
        return _error(resp, what)

    def _json(self, method: str, path: str, *, safe: bool = True, **kwargs: Any) -> dict[str, Any]:
        return dict(super()._json(method, path, safe=safe, **kwargs))

    # --- ops / models ------------------------------------------------------------------------------------
    def ready(self) -> ReadyResponse:
        resp = self._http.get("/ready")
        return _answer(ReadyResponse, resp.json())

    def upload_model(self, path: Path, name: str = "") -> ModelOut:
        """Upload a base checkpoint; returns the model (``id`` ...). Same file twice -> same id."""
        with open(path, "rb") as fh:
            return _answer(ModelOut, self._json(
                "POST", "/models", files=[("file", (Path(path).name, fh, "application/octet-stream"))],
                data={"name": name or Path(path).stem}))

    def list_models(self) -> list[ModelOut]:
        return _answer(ModelList, self._json("GET", "/models")).models

    # --- jobs --------------------------------------------------------------------------------------------
    def adapt(self, target: Path, model_id: str, config: dict[str, Any] | None = None, *,
              skip_bad_images: bool = False, contribute: bool = False, holdout: Path | None = None,
              candidates: list[str] | None = None, require_gain: bool = False,
              winner_rule: str | None = None, register_as: str | None = None,
              register_alias: str | None = None) -> JobAccepted:
        """Submit a target (a zip/tar archive, or a folder that is zipped on the fly); returns the accepted job.
        ``contribute``: once the job finished, its target images join the pool (source ``target:<job id>``).
        ``holdout`` (class folders, a CSV of path,label, or an archive): the job scores ``candidates`` on it and
        returns the winner by ``winner_rule``; with ``require_gain`` it fails when none beats the base model.
        ``register_as`` / ``register_alias``: the MLflow registered model's name and the alias its version gets
        (an API with a registry)."""
        target = Path(target)
        with tempfile.TemporaryDirectory(prefix="t3ar-submit-") as tmp, contextlib.ExitStack() as files:
            if target.is_dir():
                target = zip_folder(target, Path(tmp) / f"{target.name or 'target'}.zip")
            parts = [("archive", (target.name, files.enter_context(open(target, "rb")), "application/octet-stream"))]
            data = {"model_id": model_id, "config": json.dumps(config or {}),
                    "skip_bad_images": "true" if skip_bad_images else "false",
                    **({"contribute": "true"} if contribute else {}),
                    **({"register_as": register_as} if register_as else {}),
                    **({"register_alias": register_alias} if register_alias else {})}
            if holdout is not None:
                packed = zip_holdout(Path(holdout), Path(tmp) / "holdout.zip")
                parts.append(("holdout", (packed.name, files.enter_context(open(packed, "rb")),
                                          "application/octet-stream")))
                data |= {"candidates": ",".join(candidates or []), "require_gain": "true" if require_gain else "false",
                         "winner_rule": winner_rule or ""}
            return _answer(JobAccepted, self._json("POST", "/adapt", safe=False, files=parts, data=data))

    def job(self, job_id: str) -> JobOut:
        return _answer(JobOut, self._json("GET", f"/jobs/{_seg(job_id)}"))

    def jobs(self, *, limit: int = 50, before: str | None = None) -> JobList:
        params: dict[str, Any] = {"limit": limit}
        if before:
            params["before"] = before
        return _answer(JobList, self._json("GET", "/jobs", params=params))

    def cancel(self, job_id: str) -> CancelResponse:
        return _answer(CancelResponse, self._json("POST", f"/jobs/{_seg(job_id)}/cancel"))

    def wait(self, job_id: str, *, on_update: Callable[[JobOut], None] | None = None,
             poll: float = 1.0, timeout: float | None = None) -> JobOut:
        """Poll until the job is finished, failed or canceled; ``on_update`` gets every snapshot."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if on_update is not None:
                on_update(job)
            if job.status in TERMINAL:
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise ApiError(f"job {job_id} still {job.status} after {timeout:.0f}s")
            time.sleep(poll)

    def download_checkpoint(self, job_id: str, dest: Path, fmt: str = "pt") -> Path:
        """Stream the adapted checkpoint to ``dest`` atomically (temp file + rename). ``fmt``: ``pt`` (the t3ar
        checkpoint), ``onnx`` or ``safetensors`` (made by the API on the first request, which can take seconds;
        the file must hash to the sha256 the job then records, else nothing is kept)."""
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        self.job(job_id)  # clear errors (unknown job, auth) before streaming
        what = f"GET /jobs/{job_id}/checkpoint" + ("" if fmt == "pt" else f"?format={fmt}")

        def recorded(size: int, sha256: str) -> None:
            made = self.job(job_id).exports.get(fmt)
            want = made.sha256 if made is not None else None
            if want is not None and want != sha256:
                raise ApiError(f"{what}: the file hashes to {sha256}, the job records {want}; nothing was kept")

        path = f"/jobs/{_seg(job_id)}/checkpoint" + ("" if fmt == "pt" else f"?format={quote(fmt, safe='')}")
        self._download(path, dest, what, None if fmt == "pt" else recorded)
        return dest

    def report(self, job_id: str) -> ReportOut:
        return _answer(ReportOut, self._json("GET", f"/jobs/{_seg(job_id)}/report"))

    def retry_registration(self, job_id: str) -> Registration:
        """Try a job's failed MLflow registration again."""
        return _answer(Registration, self._json("POST", f"/jobs/{_seg(job_id)}/registration", safe=False))

    def readapt(self, job_id: str) -> JobAccepted:
        return _answer(JobAccepted, self._json("POST", f"/jobs/{_seg(job_id)}/readapt", safe=False))

    # --- pool --------------------------------------------------------------------------------------------
    def delete_pool_item(self, pool_id: str) -> DeleteResponse:
        """Withdraw a pool item (admin token); returns its lineage (``jobs``, ``in_flight``)."""
        return _answer(DeleteResponse, self._json("DELETE", f"/pool/{_seg(pool_id)}", safe=False))

    def lineage(self, pool_id: str) -> LineageResponse:
        return _answer(LineageResponse, self._json("GET", f"/pool/{_seg(pool_id)}/lineage"))

    def withdraw_contribution(self, job_id: str) -> ContributionWithdrawn:
        """Withdraw the pool images a job contributed, as one unit (admin token); returns the ids and lineage."""
        return _answer(ContributionWithdrawn, 
            self._json("DELETE", f"/jobs/{_seg(job_id)}/contribution", safe=False))

    def compact(self, *, threshold: float | None = None, sources: list[str] | None = None, nprobe: int = 2,
                plan_id: str | None = None) -> CompactResponse:
        """Pool compaction (admin token). Without ``plan_id``: a dry-run that lists what would be removed and
        returns its ``plan_id``; with it: remove exactly what that dry-run listed."""
        body: dict[str, Any] = {"dry_run": plan_id is None, "nprobe": nprobe}
        if plan_id is None:
            body.update(threshold=threshold, sources=sources)
        else:
            body["plan_id"] = plan_id
        return _answer(CompactResponse, self._json("POST", "/pool/compact", safe=False, json=body))

    # --- teams (admin) -----------------------------------------------------------------------------------
    def create_key(self, team: str, role: str, name: str = "") -> KeyCreated:
        """A new API key for ``team`` with ``role`` (admin token); the answer's ``key`` is shown this once."""
        return _answer(KeyCreated, 
            self._json("POST", "/keys", safe=False, json={"team": team, "role": role, "name": name}))

    def list_keys(self, *, team: str | None = None, revoked: bool = True) -> list[KeyOut]:
        params: dict[str, Any] = {"revoked": "true" if revoked else "false"}
        if team:
            params["team"] = team
        return _answer(KeyList, self._json("GET", "/keys", params=params)).keys

    def revoke_key(self, key_id: str) -> KeyOut:
        return _answer(KeyOut, self._json("DELETE", f"/keys/{_seg(key_id)}", safe=False))

    def audit(self, *, limit: int = 100, before: int | None = None, team: str | None = None,
              action: str | None = None, key_id: str | None = None) -> AuditList:
        """A page of the audit log, newest first (admin token); the next page starts ``before`` its
        ``next_before``."""
        params = {k: v for k, v in {"limit": limit, "before": before, "team": team, "action": action,
                                    "key_id": key_id}.items() if v is not None}
        return _answer(AuditList, self._json("GET", "/audit", params=params))

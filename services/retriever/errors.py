"""Domain errors of the retriever and their one mapping to HTTP (status, code) with the error body
``{"error": {"code": ..., "message": ...}}`` (plus ``items`` for per-item add failures).

Nothing a client sends may produce a 500: input problems are T3arError subclasses mapped here, request-shape
problems are FastAPI/Starlette errors mapped here, and anything else is logged and answered as a 500.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from t3ar.errors import ImageDecodeError, InvalidInputError, T3arError, UnsafeArchiveError
from t3ar_services.common.routing import allowed_methods

log = logging.getLogger(__name__)


class NotFoundError(InvalidInputError):
    """An id (or route) that does not exist in this pool."""


class PayloadTooLargeError(InvalidInputError):
    """A request body, file or batch exceeds a configured limit."""


class PoolConflictError(T3arError):
    """The request does not fit this pool (other embedder identity, vectors-only pool, ...)."""


class PoolIdentityError(PoolConflictError):
    """The pool on disk was built by another embedder than the configured one (start-up refusal)."""


class NotReadyError(T3arError):
    """The index is still loading or being rebuilt; retry shortly."""


class AuthError(T3arError):
    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


class ItemsRejectedError(InvalidInputError):
    """No uploaded item could be committed (or ``atomic`` and one was bad); carries the per-item results."""

    def __init__(self, message: str, items: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.items = items


_STATUS_CODES: dict[int, str] = {
    400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
    409: "conflict", 413: "payload_too_large", 415: "unsupported_media_type", 422: "invalid_input",
    503: "not_ready",
}


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **extra}}


def _classify(exc: T3arError) -> tuple[int, str]:
    """The single domain-error -> (HTTP status, code) table (most specific class first)."""
    table: list[tuple[type[T3arError], int, str]] = [
        (AuthError, 401, "unauthorized"),
        (NotFoundError, 404, "not_found"),
        (PayloadTooLargeError, 413, "payload_too_large"),
        (ItemsRejectedError, 422, "items_rejected"),
        (ImageDecodeError, 422, "bad_image"),
        (UnsafeArchiveError, 422, "unsafe_archive"),
        (InvalidInputError, 422, "invalid_input"),
        (PoolIdentityError, 409, "identity_mismatch"),
        (PoolConflictError, 409, "conflict"),
        (NotReadyError, 503, "not_ready"),
    ]
    for cls, status, code in table:
        if isinstance(exc, cls):
            if isinstance(exc, AuthError):
                return exc.status, "unauthorized" if exc.status == 401 else "forbidden"
            return status, code
    return 500, "internal"


def _domain_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, T3arError)
    status, code = _classify(exc)
    extra: dict[str, Any] = {"items": exc.items} if isinstance(exc, ItemsRejectedError) else {}
    headers: dict[str, str] = {}
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    if status == 503:
        headers["Retry-After"] = "1"
    if status >= 500:
        log.error("%s %s: %s", request.method, request.url.path, exc)
    return JSONResponse(error_body(code, str(exc), **extra), status_code=status, headers=headers)


def _validation_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    parts = []
    for err in exc.errors()[:10]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "request"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return JSONResponse(error_body("invalid_request", "; ".join(parts) or "invalid request"), status_code=422)


def _http_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _STATUS_CODES.get(exc.status_code, "error")
    message = str(exc.detail)
    if exc.status_code == 404 and message == "Not Found":
        message = f"no route {request.method} {request.url.path}; see /docs for the API"
    elif exc.status_code == 400 and "parsing the body" in message:
        message = "the request body could not be parsed: send multipart/form-data or JSON as documented"
    headers = dict(exc.headers or {})
    if exc.status_code == 405:  # every method of the resource, not only those of the first matching route
        headers["Allow"] = allowed_methods(request) or headers.get("Allow", "")
        message = f"{request.method} is not allowed on {request.url.path}; allowed: {headers['Allow']}"
    return JSONResponse(error_body(code, message), status_code=exc.status_code, headers=headers)


def _unhandled(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return JSONResponse(error_body("internal", "internal error; see the retriever log"), status_code=500)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(T3arError, _domain_handler)
    app.add_exception_handler(RequestValidationError, _validation_handler)
    app.add_exception_handler(StarletteHTTPException, _http_handler)
    app.add_exception_handler(Exception, _unhandled)

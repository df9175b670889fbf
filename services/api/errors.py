"""Domain errors of the API and their one mapping to HTTP, with the body ``{"error": {"code", "message"}}``.

Input problems are :class:`~t3ar.errors.T3arError` subclasses (core or ours) mapped here; errors coming back
from the retriever (:mod:`t3ar.clients.retriever_errors`) are mapped to what they mean for *our* caller;
request-shape problems are FastAPI/Starlette errors mapped here. Anything else is logged and answered as a
500 without details.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from t3ar.clients.retriever_errors import (
    RetrieverAuthError,
    RetrieverError,
    RetrieverInputError,
    RetrieverNotFoundError,
    RetrieverUnavailableError,
)
from t3ar.errors import CheckpointError, ImageDecodeError, InvalidInputError, T3arError, UnsafeArchiveError
from t3ar_services.common.routing import allowed_methods

log = logging.getLogger(__name__)


class NotFoundError(InvalidInputError):
    """Unknown model, job or pool item."""


class PayloadTooLargeError(InvalidInputError):
    """An upload exceeds a configured limit."""


class ConflictError(T3arError):
    """The request does not fit the current state (job not finished, model file gone...)."""


class ServiceUnavailableError(T3arError):
    """Redis or the retriever cannot be reached; retry later."""


class AuthError(T3arError):
    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


_STATUS_CODES: dict[int, str] = {
    400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
    409: "conflict", 413: "payload_too_large", 415: "unsupported_media_type", 422: "invalid_input",
    503: "unavailable",
}


def error_body(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def classify(exc: T3arError) -> tuple[int, str]:
    """The single domain-error -> (HTTP status, code) table (most specific class first)."""
    if isinstance(exc, AuthError):
        return exc.status, "unauthorized" if exc.status == 401 else "forbidden"
    table: list[tuple[type[T3arError], int, str]] = [
        (RetrieverNotFoundError, 404, "not_found"),
        (RetrieverAuthError, 502, "retriever_auth"),  # our own credentials for the retriever are wrong
        (RetrieverUnavailableError, 503, "retriever_unavailable"),
        (RetrieverInputError, 422, "retriever_rejected"),
        (RetrieverError, 502, "retriever_error"),
        (NotFoundError, 404, "not_found"),
        (PayloadTooLargeError, 413, "payload_too_large"),
        (UnsafeArchiveError, 422, "unsafe_archive"),
        (ImageDecodeError, 422, "bad_image"),
        (CheckpointError, 422, "bad_checkpoint"),
        (InvalidInputError, 422, "invalid_input"),
        (ConflictError, 409, "conflict"),
        (ServiceUnavailableError, 503, "unavailable"),
    ]
    for cls, status, code in table:
        if isinstance(exc, cls):
            return status, code
    return 500, "internal"


def _domain_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, T3arError)
    status, code = classify(exc)
    headers: dict[str, str] = {}
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    if status == 503:
        headers["Retry-After"] = "2"
    if status >= 500:
        log.error("%s %s: %s", request.method, request.url.path, exc)
    return JSONResponse(error_body(code, str(exc)), status_code=status, headers=headers)


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
    elif exc.status_code == 413:
        message = f"request body too large ({message}); see T3AR_API_MAX_UPLOAD_BYTES / _MAX_MODEL_BYTES"
    elif exc.status_code == 400 and "parsing the body" in message:
        message = "the request body could not be parsed: send multipart/form-data as documented"
    headers = dict(exc.headers or {})
    if exc.status_code == 405:  # every method of the resource, not only those of the first matching route
        headers["Allow"] = allowed_methods(request) or headers.get("Allow", "")
        message = f"{request.method} is not allowed on {request.url.path}; allowed: {headers['Allow']}"
    return JSONResponse(error_body(code, message), status_code=exc.status_code, headers=headers)


def _redis_down(request: Request, exc: Exception) -> JSONResponse:
    log.error("%s %s: Redis unavailable: %s", request.method, request.url.path, exc)
    return JSONResponse(error_body("unavailable", "the job queue (Redis) is unreachable; retry shortly"),
                        status_code=503, headers={"Retry-After": "2"})


def _unhandled(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return JSONResponse(error_body("internal", "internal error; see the API log"), status_code=500)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(T3arError, _domain_handler)
    app.add_exception_handler(RequestValidationError, _validation_handler)
    app.add_exception_handler(StarletteHTTPException, _http_handler)
    app.add_exception_handler(RedisConnectionError, _redis_down)
    app.add_exception_handler(RedisTimeoutError, _redis_down)
    app.add_exception_handler(Exception, _unhandled)

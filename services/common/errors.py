"""Errors of both services and their one mapping to HTTP, with the body ``{"error": {"code", "message"}}``.

Nothing a client sends may produce a 500: input problems are :class:`~t3ar.errors.T3arError` subclasses that a
service's :class:`ErrorMap` maps to a status and code; request-shape problems (validation, unknown routes,
405, unparsable bodies) are FastAPI/Starlette errors mapped here; anything else is logged and answered as a 500
without details.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from t3ar.errors import ImageDecodeError, InvalidInputError, T3arError, UnsafeArchiveError
from t3ar_services.common.routing import allowed_methods

log = logging.getLogger(__name__)


class NotFoundError(InvalidInputError):
    """An id (model, job, pool item) that does not exist here."""


class PayloadTooLargeError(InvalidInputError):
    """A request body, upload, file or batch exceeds a configured limit."""


class AuthError(T3arError):
    """No or unknown bearer token (``status`` 401), or one without the scope a route needs (403)."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


#: input errors every service answers alike, after its own table (which holds the more specific classes)
_INPUT_ERRORS: list[tuple[type[T3arError], int, str]] = [
    (NotFoundError, 404, "not_found"),
    (PayloadTooLargeError, 413, "payload_too_large"),
    (UnsafeArchiveError, 422, "unsafe_archive"),
    (ImageDecodeError, 422, "bad_image"),
    (InvalidInputError, 422, "invalid_input"),
]

_STATUS_CODES: dict[int, str] = {
    400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
    409: "conflict", 413: "payload_too_large", 415: "unsupported_media_type", 422: "invalid_input",
}


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **extra}}


@dataclass(frozen=True)
class ErrorMap:
    """How one service answers errors.

    ``table``: domain error class -> (status, code), most specific class first; then come not found (404), too
    large (413), unsafe archive, bad image and any other invalid input (422); an :class:`AuthError` carries its
    own status. ``service`` names the service in the 500 message; ``retry_after``: seconds a 503 asks a
    client to wait (unless the error carries its own ``retry_after``); ``unavailable_code``: the code of a
    framework 503; ``bodies``: what a parsable body is (the 400 for an unparsable one says so);
    ``too_large_hint``: ends the message of a framework 413; ``extra``: more fields of an error's body (e.g.
    per-item results).
    """

    service: str
    table: Sequence[tuple[type[T3arError], int, str]]
    retry_after: str
    unavailable_code: str
    bodies: str
    too_large_hint: str = ""
    extra: Callable[[T3arError], dict[str, Any]] = field(default=lambda exc: {})  # instance attribute: unbound

    def classify(self, exc: T3arError) -> tuple[int, str]:
        """The single domain-error -> (HTTP status, code) table."""
        if isinstance(exc, AuthError):
            return exc.status, "unauthorized" if exc.status == 401 else "forbidden"
        for cls, status, code in [*self.table, *_INPUT_ERRORS]:
            if isinstance(exc, cls):
                return status, code
        return 500, "internal"

    def _domain(self, request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, T3arError)
        status, code = self.classify(exc)
        headers: dict[str, str] = {}
        if status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        if status == 503:
            own = getattr(exc, "retry_after", None)  # an error that knows how long (e.g. a training to wait for)
            headers["Retry-After"] = self.retry_after if own is None else str(own)
        if status >= 500:
            log.error("%s %s: %s", request.method, request.url.path, exc)
        return JSONResponse(error_body(code, str(exc), **self.extra(exc)), status_code=status, headers=headers)

    def _http(self, request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = {**_STATUS_CODES, 503: self.unavailable_code}.get(exc.status_code, "error")
        message = str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = f"no route {request.method} {request.url.path}; see /docs for the API"
        elif exc.status_code == 413 and self.too_large_hint:
            message = f"request body too large ({message}){self.too_large_hint}"
        elif exc.status_code == 400 and "parsing the body" in message:
            message = f"the request body could not be parsed: send {self.bodies} as documented"
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # every method of the resource, not only those of the first matching route
            headers["Allow"] = allowed_methods(request) or headers.get("Allow", "")
            message = f"{request.method} is not allowed on {request.url.path}; allowed: {headers['Allow']}"
        return JSONResponse(error_body(code, message), status_code=exc.status_code, headers=headers)

    def _unhandled(self, request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return JSONResponse(error_body("internal", f"internal error; see the {self.service} log"), status_code=500)

    def install(self, app: FastAPI) -> None:
        app.add_exception_handler(T3arError, self._domain)
        app.add_exception_handler(RequestValidationError, _validation_handler)
        app.add_exception_handler(StarletteHTTPException, self._http)
        app.add_exception_handler(Exception, self._unhandled)


def _validation_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    parts = []
    for err in exc.errors()[:10]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "request"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return JSONResponse(error_body("invalid_request", "; ".join(parts) or "invalid request"), status_code=422)

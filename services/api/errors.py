"""Domain errors of the API and their one mapping to HTTP (:class:`~t3ar_services.common.errors.ErrorMap`).

Input problems are :class:`~t3ar.errors.T3arError` subclasses (core or ours) mapped here; errors coming back
from the retriever (:mod:`t3ar.clients.retriever_errors`) are mapped to what they mean for *our* caller; Redis
being unreachable is a 503. Request-shape problems and anything else: :mod:`t3ar_services.common.errors`.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from t3ar.clients.retriever_errors import (
    RetrieverAuthError,
    RetrieverError,
    RetrieverInputError,
    RetrieverNotFoundError,
    RetrieverUnavailableError,
)
from t3ar.errors import CheckpointError, ExportError, ExportTooLargeError, MissingDependencyError, T3arError
from t3ar_services.common.errors import AuthError, ErrorMap, NotFoundError, PayloadTooLargeError, error_body

log = logging.getLogger(__name__)

__all__ = ["AuthError", "ConflictError", "NotFoundError", "PayloadTooLargeError", "ServiceUnavailableError",
           "classify", "install_error_handlers"]


class ConflictError(T3arError):
    """The request does not fit the current state (job not finished, model file gone...)."""


class ServiceUnavailableError(T3arError):
    """Redis or the retriever cannot be reached; retry later."""


ERRORS = ErrorMap(
    service="API", retry_after="2", unavailable_code="unavailable", bodies="multipart/form-data",
    too_large_hint="; see T3AR_API_MAX_UPLOAD_BYTES / _MAX_MODEL_BYTES",
    table=[
        (RetrieverNotFoundError, 404, "not_found"),
        (RetrieverAuthError, 502, "retriever_auth"),  # our own credentials for the retriever are wrong
        (RetrieverUnavailableError, 503, "retriever_unavailable"),
        (RetrieverInputError, 422, "retriever_rejected"),
        (RetrieverError, 502, "retriever_error"),
        (CheckpointError, 422, "bad_checkpoint"),
        # an export over T3AR_API_MAX_EXPORT_MEMORY_BYTES: refused before it starts
        (ExportTooLargeError, 422, "export_too_large"),
        # an export that does not reproduce its checkpoint (parity figures in the message): kept nowhere
        (ExportError, 422, "export_failed"),
        (MissingDependencyError, 503, "unavailable"),  # onnx/onnxruntime not installed on this server
        (ConflictError, 409, "conflict"),
        (ServiceUnavailableError, 503, "unavailable"),
    ])
classify = ERRORS.classify


def _redis_down(request: Request, exc: Exception) -> JSONResponse:
    log.error("%s %s: Redis unavailable: %s", request.method, request.url.path, exc)
    return JSONResponse(error_body("unavailable", "the job queue (Redis) is unreachable; retry shortly"),
                        status_code=503, headers={"Retry-After": "2"})


def install_error_handlers(app: FastAPI) -> None:
    ERRORS.install(app)
    app.add_exception_handler(RedisConnectionError, _redis_down)
    app.add_exception_handler(RedisTimeoutError, _redis_down)

"""Errors raised by :class:`t3ar.clients.retriever.RetrieverClient`, mapped from the service's error body
``{"error": {"code", "message"}}`` onto the core's :class:`~t3ar.errors.T3arError` hierarchy, so callers can
catch e.g. ``InvalidInputError`` whether the pool is local or remote."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter, ValidationError

from t3ar.clients.retriever_models import AddItemResult
from t3ar.errors import ImageDecodeError, InvalidInputError, T3arError, UnsafeArchiveError


class RetrieverError(T3arError):
    """Any error answered by (or on the way to) the retriever; ``status`` 0 means no HTTP answer."""

    def __init__(self, message: str, *, status: int = 0, code: str = "", items: list[AddItemResult] | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.items = items or []


class RetrieverInputError(RetrieverError, InvalidInputError):
    """4xx: the request was not usable (bad vectors, k out of range, too large, rejected items...)."""


class RetrieverImageError(RetrieverInputError, ImageDecodeError):
    """An image sent to the retriever is not readable."""


class RetrieverArchiveError(RetrieverInputError, UnsafeArchiveError):
    """An archive sent to the retriever was refused (traversal, links, too many/large members)."""


class RetrieverNotFoundError(RetrieverInputError):
    """Unknown pool id (never added, or withdrawn)."""


class RetrieverAuthError(RetrieverError):
    """401 (missing/invalid token) or 403 (the admin token is needed)."""


class RetrieverConflictError(RetrieverError):
    """409: the request does not fit this pool (other embedder identity, vectors-only pool...)."""


class RetrieverUnavailableError(RetrieverError):
    """The retriever could not be reached, is not ready, or kept failing after retries."""


_BY_CODE: dict[str, type[RetrieverError]] = {
    "bad_image": RetrieverImageError, "unsafe_archive": RetrieverArchiveError, "not_found": RetrieverNotFoundError,
    "unauthorized": RetrieverAuthError, "forbidden": RetrieverAuthError, "conflict": RetrieverConflictError,
    "identity_mismatch": RetrieverConflictError, "not_ready": RetrieverUnavailableError,
}


def _items(value: Any) -> list[AddItemResult] | None:
    """An error's per-item report (a refused add), or None when it has none that reads."""
    try:
        return TypeAdapter(list[AddItemResult]).validate_python(value) if value is not None else None
    except ValidationError:
        return None


def error_from_response(status: int, body: Any, fallback_text: str, what: str) -> RetrieverError:
    """The exception for an HTTP error answer (``what`` names the call, e.g. ``POST /search``)."""
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        code, message = str(err.get("code", "")), str(err.get("message", ""))
        items = _items(err.get("items"))
    else:
        code, message, items = "", fallback_text[:500] or f"HTTP {status}", None
    cls = _BY_CODE.get(code)
    if cls is None:
        cls = RetrieverInputError if 400 <= status < 500 else \
            RetrieverUnavailableError if status in (502, 503, 504) else RetrieverError
    return cls(f"retriever {what}: {message} (HTTP {status}{' ' + code if code else ''})", status=status, code=code,
               items=items)

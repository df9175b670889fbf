"""Domain errors of the retriever and their one mapping to HTTP (:class:`~t3ar_services.common.errors.ErrorMap`),
with the error body ``{"error": {"code": ..., "message": ...}}`` (plus ``items`` for per-item add failures).

Request-shape problems and anything else: :mod:`t3ar_services.common.errors`.
"""

from __future__ import annotations

from typing import Any

from t3ar.errors import InvalidInputError, T3arError
from t3ar_services.common.errors import AuthError, ErrorMap, NotFoundError, PayloadTooLargeError

__all__ = ["AuthError", "ItemsRejectedError", "NotFoundError", "NotReadyError", "PayloadTooLargeError",
           "PoolConflictError", "PoolIdentityError", "install_error_handlers"]


class PoolConflictError(T3arError):
    """The request does not fit this pool (other embedder identity, vectors-only pool, ...)."""


class PoolIdentityError(PoolConflictError):
    """The pool on disk was built by another embedder than the configured one (start-up refusal)."""


class NotReadyError(T3arError):
    """The index is still loading or being rebuilt; retry shortly (after ``retry_after`` seconds, where given:
    the 503's ``Retry-After``)."""

    def __init__(self, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ItemsRejectedError(InvalidInputError):
    """No uploaded item could be committed (or ``atomic`` and one was bad); carries the per-item results."""

    def __init__(self, message: str, items: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.items = items


def _items(exc: T3arError) -> dict[str, Any]:
    return {"items": exc.items} if isinstance(exc, ItemsRejectedError) else {}


ERRORS = ErrorMap(
    service="retriever", retry_after="1", unavailable_code="not_ready", bodies="multipart/form-data or JSON",
    extra=_items,
    table=[
        (ItemsRejectedError, 422, "items_rejected"),
        (PoolIdentityError, 409, "identity_mismatch"),
        (PoolConflictError, 409, "conflict"),
        (NotReadyError, 503, "not_ready"),
    ])
install_error_handlers = ERRORS.install

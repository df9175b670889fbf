"""Bearer-token auth of both services: two tokens per service, a plain one and an admin one, and on the API a
third, the workers' (``worker_token``: the worker routes, nothing else; no other token opens those).

No or unknown token -> 401; the plain token on a route that needs the admin one -> 403; the worker token on
any other route, or another token on a worker route -> 403; with auth disabled every request is admin and may
do everything. Tokens are compared in constant time (:func:`token_matches`, which the
credentials-first middleware uses too).
"""

from __future__ import annotations

from typing import Literal, Protocol

from fastapi.security import HTTPAuthorizationCredentials
from pydantic import SecretStr

from t3ar_services.common.credentials import token_matches
from t3ar_services.common.errors import AuthError


class TokenSettings(Protocol):
    @property
    def token(self) -> SecretStr | None: ...

    @property
    def admin_token(self) -> SecretStr | None: ...

    @property
    def auth_disabled(self) -> bool: ...


Scope = Literal["token", "admin", "worker"]


def worker_token(settings: TokenSettings) -> SecretStr | None:
    """The settings' worker token (only the API's settings have one)."""
    token = getattr(settings, "worker_token", None)
    return token if isinstance(token, SecretStr) else None


def scope_of(settings: TokenSettings, creds: HTTPAuthorizationCredentials | None) -> Scope:
    if settings.auth_disabled:
        return "admin"
    if creds is None or creds.scheme.lower() != "bearer" or not creds.credentials:
        raise AuthError("missing bearer token: send 'Authorization: Bearer <token>'", status=401)
    if token_matches(creds.credentials, [settings.admin_token]):
        return "admin"
    if token_matches(creds.credentials, [settings.token]):
        return "token"
    if token_matches(creds.credentials, [worker_token(settings)]):
        return "worker"
    raise AuthError("invalid bearer token", status=401)


def require(settings: TokenSettings, creds: HTTPAuthorizationCredentials | None, *, admin: str = "",
            worker: str = "") -> None:
    """Any known token but the worker's; with ``admin`` (the 403 message, naming the admin token's setting) the
    admin one; with ``worker`` (the 403 message for the others) the worker one."""
    scope = scope_of(settings, creds)
    if settings.auth_disabled:
        return
    if worker:
        if scope != "worker":
            raise AuthError(worker, status=403)
        return
    if scope == "worker":
        raise AuthError("the worker token opens only the worker routes (/internal/...); use the user or admin "
                        "token", status=403)
    if scope != "admin" and admin:
        raise AuthError(admin, status=403)

"""Bearer-token auth of both services: two tokens per service, a plain one and an admin one.

No or unknown token -> 401; the plain token on a route that needs the admin one -> 403; with auth disabled
every request is admin. Tokens are compared in constant time (:func:`token_matches`, which the
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


def scope_of(settings: TokenSettings, creds: HTTPAuthorizationCredentials | None) -> Literal["token", "admin"]:
    if settings.auth_disabled:
        return "admin"
    if creds is None or creds.scheme.lower() != "bearer" or not creds.credentials:
        raise AuthError("missing bearer token: send 'Authorization: Bearer <token>'", status=401)
    if token_matches(creds.credentials, [settings.admin_token]):
        return "admin"
    if token_matches(creds.credentials, [settings.token]):
        return "token"
    raise AuthError("invalid bearer token", status=401)


def require(settings: TokenSettings, creds: HTTPAuthorizationCredentials | None, *, admin: str = "") -> None:
    """Any known token; with ``admin`` (the 403 message, naming the admin token's setting) the admin one."""
    if scope_of(settings, creds) != "admin" and admin:
        raise AuthError(admin, status=403)

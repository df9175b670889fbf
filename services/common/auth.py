"""Bearer-token auth of both services: two tokens per service, a plain one and an admin one, and on the API a
third, the workers' (``worker_token``: the worker routes, nothing else; no other token opens those).

No or unknown token -> 401; the plain token on a route that needs the admin one -> 403; the worker token on
any other route, or another token on a worker route -> 403; with auth disabled every request is admin and may
do everything. Tokens are compared in constant time (:func:`token_matches`, which the
credentials-first middleware uses too).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from fastapi import APIRouter
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import SecretStr
from starlette.routing import Match
from starlette.types import Scope as AsgiScope

from t3ar_services.common.credentials import Scope, scope_refusal, token_matches
from t3ar_services.common.errors import AuthError


class TokenSettings(Protocol):
    @property
    def token(self) -> SecretStr | None: ...

    @property
    def admin_token(self) -> SecretStr | None: ...

    @property
    def auth_disabled(self) -> bool: ...


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
    need: Scope = "worker" if worker else "admin" if admin else "token"
    why = scope_refusal(scope, need, worker or admin)
    if why is not None:
        raise AuthError(why, status=403)


F = TypeVar("F", bound=Callable[..., Any])


def route_scope(need: Scope, message: str = "") -> Callable[[F], F]:
    """Mark a route's auth dependency with the scope it requires (and its 403 words), so that the
    credentials-first middleware can refuse a token without that scope before the body is read."""
    def mark(fn: F) -> F:
        fn.t3ar_scope = (need, message)  # type: ignore[attr-defined]
        return fn
    return mark


def token_scopes(settings: TokenSettings) -> Callable[[str], str | None]:
    """``scope(token)``: the scope of a known token (constant-time compares), else None."""
    known = [(t.get_secret_value().encode(), name) for t, name in (
        (settings.admin_token, "admin"), (settings.token, "token"), (worker_token(settings), "worker"))
        if t is not None]

    def scope(given: str) -> str | None:
        raw = given.encode()
        found = None
        for k, name in known:
            if secrets.compare_digest(raw, k) and found is None:
                found = name
        return found

    return scope


_RANK = {"read": 0, "token": 1, "admin": 2, "worker": 3}


class RouteScopes:
    """``needs(asgi_scope)``: the ``(scope, message)`` that the route matching a request requires (from its
    :func:`route_scope`-marked dependency), or None. Filled from the service's routers (their routes carry the
    routers' own dependencies and prefixes)."""

    def __init__(self) -> None:
        self.table: list[tuple[APIRoute, tuple[str, str]]] = []

    def fill(self, routers: Sequence[APIRouter]) -> None:
        """A route with several marked dependencies (its router's and its own) needs the most demanding."""
        for route in (r for router in routers for r in router.routes):
            if isinstance(route, APIRoute):
                stack, tags = list(route.dependant.dependencies), []
                while stack:
                    dep = stack.pop()
                    tag = getattr(dep.call, "t3ar_scope", None)
                    if tag is not None:
                        tags.append(tag)
                    else:
                        stack.extend(dep.dependencies)
                if tags:
                    self.table.append((route, max(tags, key=lambda t: _RANK.get(t[0], 0))))

    def needs(self, scope: AsgiScope) -> tuple[str, str] | None:
        for route, tag in self.table:
            if route.matches(scope)[0] == Match.FULL:
                return tag
        return None

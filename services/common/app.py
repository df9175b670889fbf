"""The app factory both services build on: FastAPI with the error mapping and the one middleware stack.

Middleware, outermost first: request id + access log (every answer carries the id and is logged), metrics
(times everything below), failed sign-ins per client address (429 past a budget, where a service gives one),
credentials first (a client without a known token gets 401 before any byte of its
body is read; not under ``session_prefixes``, the API's web console, whose routes check their session cookie
before reading a body), the body limit (413), innermost.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi_offline import FastAPIOffline
from starlette.types import ASGIApp, Receive, Scope, Send

import t3ar
from t3ar_services.common.auth import RouteScopes, TokenSettings, token_scopes, worker_token
from t3ar_services.common.auth_failures import AuthFailuresMiddleware, FailureWindow
from t3ar_services.common.body_limit import BodyLimitMiddleware, LimitFor
from t3ar_services.common.credentials import CredentialsFirstMiddleware, token_matcher
from t3ar_services.common.forms import strict_multipart_text
from t3ar_services.common.metrics import MetricsMiddleware, ServiceMetrics
from t3ar_services.common.request_id import RequestIdMiddleware

#: where the API docs' scripts and styles are served from (fastapi-offline's copies of Swagger UI and ReDoc)
DOCS_ASSETS = "/docs-assets"


class UnlessUnder:
    """Middleware ``inner`` (built with ``options``) for every path except those under ``prefixes``, which go
    straight to the app: the API's web console (``/ui``) signs in with a session cookie, not a bearer token, and
    checks that cookie itself before it reads any body."""

    def __init__(self, app: ASGIApp, *, inner: Any, options: dict[str, Any], prefixes: Sequence[str]) -> None:
        self.app = app
        self.wrapped = inner(app, **options)
        self.prefixes = tuple(prefixes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if any(path == p or path.startswith(p + "/") for p in self.prefixes):
            await self.app(scope, receive, send)
        else:
            await self.wrapped(scope, receive, send)


def _or_key(accepts: Callable[[str], bool], key_scope: Callable[[str], str | None]) -> Callable[[str], bool]:
    return lambda token: accepts(token) or key_scope(token) is not None


def _scope_or_key(scope_of: Callable[[str], str | None],
                  key_scope: Callable[[str], str | None]) -> Callable[[str], str | None]:
    return lambda token: scope_of(token) or key_scope(token)


def create_service_app(*, settings: TokenSettings, install_errors: Callable[[FastAPI], None],
                       metrics: ServiceMetrics, body_limit: int, body_hint: str, routers: Sequence[APIRouter],
                       limit_for: LimitFor | None = None,
                       session_prefixes: Sequence[str] = (), failures: FailureWindow | None = None,
                       sign_in_paths: Sequence[str] = (), own_budget_prefixes: Sequence[str] = (),
                       key_scope: Callable[[str], str | None] | None = None,
                       **fastapi: Any) -> FastAPI:
    """``body_hint`` ends the 413's message (which setting bounds what, what to send instead); ``limit_for``: a
    route's tighter (limit, hint) of its own; ``fastapi``: the app's title, description, lifespan, form limits.
    ``session_prefixes``: paths the credentials-first check leaves to the routes (the API's console, which checks
    its own session cookie before reading a body). ``failures``: a budget of failed sign-ins per client address
    (:mod:`~t3ar_services.common.auth_failures`; bearer tokens and ``sign_in_paths``; paths under
    ``own_budget_prefixes`` count apart). ``key_scope(token)``: the
    scope of a token that is none of the settings' own (the API's named keys), or None."""
    strict_multipart_text()  # process-wide; idempotent
    # /docs and /redoc load Swagger UI and ReDoc from the package (under DOCS_ASSETS), never from a public CDN
    app = FastAPIOffline(version=getattr(t3ar, "__version__", "0"), static_url=DOCS_ASSETS, **fastapi)
    install_errors(app)
    app.add_middleware(BodyLimitMiddleware, limit=body_limit, hint=body_hint, limit_for=limit_for)
    accepts = token_matcher((settings.token, settings.admin_token, worker_token(settings)))  # settings are frozen
    scope_of = token_scopes(settings)
    if key_scope is not None:
        accepts = _or_key(accepts, key_scope)
        scope_of = _scope_or_key(scope_of, key_scope)
    routes = RouteScopes()  # filled below, once the routers are in (the middleware stack is built on first use)
    app.add_middleware(UnlessUnder, inner=CredentialsFirstMiddleware, prefixes=session_prefixes,
                       options={"enabled": not settings.auth_disabled, "accepts": accepts,
                                "scope_of": scope_of, "needs": routes.needs})
    if failures is not None and not settings.auth_disabled:  # outside the credentials check: it counts its 401s
        app.add_middleware(AuthFailuresMiddleware, failures=failures, sign_in_paths=sign_in_paths,
                           own_budget_prefixes=own_budget_prefixes)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    app.add_middleware(RequestIdMiddleware)
    for router in routers:
        app.include_router(router)
    routes.fill(routers)
    return app

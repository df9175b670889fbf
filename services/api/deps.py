"""Dependencies: the service state on ``app.state.api`` and bearer-token auth.

Scopes: the user token (``T3AR_API_TOKEN``) may upload models, adapt, read, cancel and readapt; the admin
token (``T3AR_API_ADMIN_TOKEN``) may do all that and withdraw pool items. No or unknown token -> 401, user
token on an admin route -> 403. ``/health``, ``/ready`` and ``/metrics`` need no token.
A request with a body and no known token is refused earlier, before its body is read
(:mod:`t3ar_services.common.credentials`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from redis import Redis

from t3ar.clients.retriever import RetrieverClient
from t3ar_services.api.errors import AuthError
from t3ar_services.api.jobs import JobService
from t3ar_services.api.metrics import ApiMetrics
from t3ar_services.api.settings import ApiSettings
from t3ar_services.api.store import Store
from t3ar_services.common.credentials import token_matches


@dataclass
class ApiState:
    settings: ApiSettings
    store: Store
    redis: Redis
    jobs: JobService
    retriever: RetrieverClient  # read/write token: stats before enqueueing
    retriever_admin: RetrieverClient  # admin token: forwarded deletes
    metrics: ApiMetrics


def get_state(request: Request) -> ApiState:
    state: ApiState = request.app.state.api
    return state


StateDep = Annotated[ApiState, Depends(get_state)]


def get_settings(state: StateDep) -> ApiSettings:
    return state.settings


SettingsDep = Annotated[ApiSettings, Depends(get_settings)]

_bearer = HTTPBearer(auto_error=False, description="T3AR_API_TOKEN (user) or T3AR_API_ADMIN_TOKEN (admin)")
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _scope_of(settings: ApiSettings, creds: HTTPAuthorizationCredentials | None) -> Literal["user", "admin"]:
    if settings.auth_disabled:
        return "admin"
    if creds is None or creds.scheme.lower() != "bearer" or not creds.credentials:
        raise AuthError("missing bearer token: send 'Authorization: Bearer <token>'", status=401)
    if token_matches(creds.credentials, [settings.admin_token]):
        return "admin"
    if token_matches(creds.credentials, [settings.token]):
        return "user"
    raise AuthError("invalid bearer token", status=401)


def require_user(settings: SettingsDep, creds: BearerDep) -> None:
    _scope_of(settings, creds)


def require_admin(settings: SettingsDep, creds: BearerDep) -> None:
    if _scope_of(settings, creds) != "admin":
        raise AuthError("withdrawing pool items needs the admin token (T3AR_API_ADMIN_TOKEN)", status=403)


USER = [Depends(require_user)]
ADMIN = [Depends(require_admin)]

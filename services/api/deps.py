"""Dependencies: the service state on ``app.state.api`` and bearer-token auth.

Scopes: the user token (``T3AR_API_TOKEN``) may upload models, adapt, read, cancel and readapt; the admin
token (``T3AR_API_ADMIN_TOKEN``) may do all that and withdraw pool items; the worker token
(``T3AR_API_WORKER_TOKEN``) may use the worker routes (``/internal/...``: a job's inputs down, its checkpoint
and result up) and nothing else, and no other token may use those. No or unknown token -> 401, user
token on an admin route -> 403. ``/health``, ``/ready`` and ``/metrics`` need no token.
A request with a body and no known token is refused earlier, before its body is read
(:mod:`t3ar_services.common.credentials`). The check itself: :mod:`t3ar_services.common.auth`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from redis import Redis

from t3ar.clients.retriever import RetrieverClient
from t3ar_services.api.compaction import Compactor
from t3ar_services.api.contributions import Contributor
from t3ar_services.api.domain import Links
from t3ar_services.api.jobs import JobService
from t3ar_services.api.leftovers import Submissions
from t3ar_services.api.metrics import ApiMetrics
from t3ar_services.api.settings import ApiSettings
from t3ar_services.api.store import Store
from t3ar_services.api.transfer import Artifacts
from t3ar_services.api.withdrawals import Withdrawer
from t3ar_services.common.auth import require, route_scope


@dataclass
class ApiState:
    settings: ApiSettings
    store: Store
    redis: Redis
    jobs: JobService
    retriever: RetrieverClient  # read/write token: stats before enqueueing
    retriever_admin: RetrieverClient  # admin token: forwarded deletes
    metrics: ApiMetrics
    artifacts: Artifacts  # what workers upload, verified and committed
    contributor: Contributor  # targets that join the pool, and their withdrawal
    compactor: Compactor  # pool compaction: dry-run plans, applied exactly
    withdrawer: Withdrawer  # the one path by which items leave the pool
    submissions: Submissions = field(default_factory=Submissions)  # job folders being written now (leftovers.py)


def get_state(request: Request) -> ApiState:
    state: ApiState = request.app.state.api
    return state


StateDep = Annotated[ApiState, Depends(get_state)]


def get_settings(state: StateDep) -> ApiSettings:
    return state.settings


SettingsDep = Annotated[ApiSettings, Depends(get_settings)]


def public_base(request: Request, settings: ApiSettings) -> str:
    """The base of the API's absolute links: ``T3AR_API_PUBLIC_URL``, else the scheme and address of the socket
    this server accepted the connection on, plus the root path. Never the request's ``Host`` header: a client
    chooses that, and a link in an answer (or one a proxy caches) would point wherever it said."""
    if settings.public_url:
        return settings.public_url.rstrip("/")
    scheme = str(request.scope.get("scheme") or "http")
    server = request.scope.get("server")
    host, port = (str(server[0]), server[1]) if server else ("127.0.0.1", None)
    if ":" in host:
        host = f"[{host}]"  # an IPv6 address
    netloc = host if port is None or (scheme, port) in (("http", 80), ("https", 443)) else f"{host}:{port}"
    return f"{scheme}://{netloc}{request.scope.get('root_path', '')}".rstrip("/")


def links_of(request: Request) -> Links:
    """Absolute URLs of the job routes the domain layer links to, on :func:`public_base`."""
    base = public_base(request, get_state(request).settings)
    return lambda route, job_id: base + str(request.app.url_path_for(route, job_id=job_id))


LinksDep = Annotated[Links, Depends(links_of)]

_bearer = HTTPBearer(auto_error=False, description="T3AR_API_TOKEN (user), T3AR_API_ADMIN_TOKEN (admin) or, on "
                                                   "/internal routes only, T3AR_API_WORKER_TOKEN (workers)")
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


_ADMIN_WORDS = "withdrawing pool items needs the admin token (T3AR_API_ADMIN_TOKEN)"
_WORKER_WORDS = ("the worker routes need the worker token (T3AR_API_WORKER_TOKEN, given to workers as "
                 "T3AR_WORKER_API_TOKEN)")


@route_scope("token")
def require_user(settings: SettingsDep, creds: BearerDep) -> None:
    require(settings, creds)


@route_scope("admin", _ADMIN_WORDS)
def require_admin(settings: SettingsDep, creds: BearerDep) -> None:
    require(settings, creds, admin=_ADMIN_WORDS)


@route_scope("worker", _WORKER_WORDS)
def require_worker(settings: SettingsDep, creds: BearerDep) -> None:
    require(settings, creds, worker=_WORKER_WORDS)


USER = [Depends(require_user)]
WORKER = [Depends(require_worker)]
ADMIN = [Depends(require_admin)]

"""Dependencies: the service state on ``app.state.api`` and bearer-token auth.

Scopes: the user token (``T3AR_API_TOKEN``) may upload models, adapt, read, cancel and readapt; the admin
token (``T3AR_API_ADMIN_TOKEN``) may do all that and withdraw pool items; a named API key
(:mod:`t3ar_services.api.keys`) what its role allows, for its team; every request's :class:`Principal` (key id,
team, role) is :func:`current_principal`; the worker token
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
from t3ar_services.api.audit import ROUTE_ACTIONS, AuditLog
from t3ar_services.api.compaction import Compactor
from t3ar_services.api.contributions import Contributor
from t3ar_services.api.domain import Links
from t3ar_services.api.jobs import JobService
from t3ar_services.api.keys import ADMIN as ADMIN_TOKEN
from t3ar_services.api.keys import ANONYMOUS, KeyStore, Principal
from t3ar_services.api.keys import USER as USER_TOKEN
from t3ar_services.api.leftovers import Submissions
from t3ar_services.api.metrics import ApiMetrics
from t3ar_services.api.modelreg.registrar import Registrar
from t3ar_services.api.settings import ApiSettings
from t3ar_services.api.store import Store
from t3ar_services.api.transfer import Artifacts
from t3ar_services.api.withdrawals import Withdrawer
from t3ar_services.common.auth import require, route_scope, worker_token
from t3ar_services.common.credentials import WORKER_ELSEWHERE, token_matches
from t3ar_services.common.errors import AuthError


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
    keys: KeyStore  # named API keys (digests), each of a team with a role
    audit: AuditLog  # who did what, when, from where
    registrar: Registrar  # finished jobs -> the MLflow model registry (off unless T3AR_MLFLOW_TRACKING_URI)

    def principal_of(self, token: str) -> Principal | None:
        """Who a bearer token is: the admin or user token (team ``default``), a valid named key, else None (the
        worker token included)."""
        if token_matches(token, [self.settings.admin_token]):
            return ADMIN_TOKEN
        if token_matches(token, [self.settings.token]):
            return USER_TOKEN
        return self.keys.lookup(token)

    def key_scope(self, token: str) -> str | None:
        """The credentials-first middleware's scope of a named key (``read``, ``token`` or ``admin``), or None."""
        found = self.keys.lookup(token)
        return found.scope if found is not None else None
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


def client_of(request: Request) -> str:
    """The client's address as the API sees it (a proxy's, unless the proxy is trusted to forward it)."""
    return request.client.host if request.client is not None else ""


ClientDep = Annotated[str, Depends(client_of)]

_bearer = HTTPBearer(auto_error=False, description="T3AR_API_TOKEN (user), T3AR_API_ADMIN_TOKEN (admin), a named "
                                                   "API key (t3ar keys create) or, on /internal routes only, "
                                                   "T3AR_API_WORKER_TOKEN (workers)")
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


_ADMIN_WORDS = "this needs the admin token (T3AR_API_ADMIN_TOKEN) or a key with role admin"
_SUBMIT_WORDS = "this needs a key with role submit or admin: this key may only read"
_WORKER_WORDS = ("the worker routes need the worker token (T3AR_API_WORKER_TOKEN, given to workers as "
                 "T3AR_WORKER_API_TOKEN)")


def current_principal(state: StateDep, creds: BearerDep) -> Principal:
    """The request's principal (FastAPI caches it per request): 401 for no or an unknown token (a revoked key
    included), 403 for the worker token (it opens the worker routes only)."""
    if state.settings.auth_disabled:
        return ANONYMOUS
    if creds is None or creds.scheme.lower() != "bearer" or not creds.credentials:
        raise AuthError("missing bearer token: send 'Authorization: Bearer <token>'", status=401)
    found = state.principal_of(creds.credentials)
    if found is not None:
        return found
    if token_matches(creds.credentials, [worker_token(state.settings)]):
        raise AuthError(WORKER_ELSEWHERE, status=403)
    raise AuthError("invalid bearer token", status=401)


PrincipalDep = Annotated[Principal, Depends(current_principal)]


@route_scope("read")
def require_user(who: PrincipalDep) -> None:
    """Any principal (every role reads its own team's)."""


def refused(request: Request, who: Principal, words: str) -> AuthError:
    """The 403 for ``who`` on this route, recorded first in the audit log (outcome ``refused``) under the route's
    action (:data:`~t3ar_services.api.audit.ROUTE_ACTIONS`; another route's as ``request``)."""
    name = getattr(request.scope.get("endpoint"), "__name__", "")
    params = request.path_params
    target = str(params.get("pool_id") or params.get("job_id") or params.get("key_id") or "")
    action = ROUTE_ACTIONS.get(name, "request")
    detail = f"403: {words}" if name in ROUTE_ACTIONS else f"403 {request.method} {request.url.path}: {words}"
    get_state(request).audit.record(key_id=who.key_id, team=who.team, action=action, target=target,
                                    client=client_of(request), outcome="refused", detail=detail)
    return AuthError(words, status=403)


@route_scope("token", _SUBMIT_WORDS)
def require_submit(request: Request, who: PrincipalDep) -> Principal:
    if not who.can_submit:
        raise refused(request, who, _SUBMIT_WORDS)
    return who


SubmitterDep = Annotated[Principal, Depends(require_submit)]  # a route parameter: the principal, who may submit


@route_scope("admin", _ADMIN_WORDS)
def require_admin(request: Request, who: PrincipalDep) -> None:
    if not who.admin:
        raise refused(request, who, _ADMIN_WORDS)


@route_scope("worker", _WORKER_WORDS)
def require_worker(settings: SettingsDep, creds: BearerDep) -> None:
    require(settings, creds, worker=_WORKER_WORDS)


USER = [Depends(require_user)]
SUBMIT = [Depends(require_submit)]
WORKER = [Depends(require_worker)]
ADMIN = [Depends(require_admin)]

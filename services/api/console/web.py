"""The console's web plumbing: templates (Jinja2, autoescaped), the security headers (sent by
:mod:`~t3ar_services.api.console.answers`), the session dependency, CSRF-checked forms and HTML error pages.
Guarded file names are :func:`t3ar_services.common.files.file_inside`; thumbnails and their PNG answers are
:mod:`~t3ar_services.api.console.thumbs`.

Every page and action goes through :func:`current_session` (a signed-in session, else a redirect to sign-in);
every POST through :func:`checked_form`, which checks the session *before* reading the body and the CSRF token
after. Calls into the domain layer (:mod:`t3ar_services.api.domain`, which the JSON routes call too) go through
:func:`call`, which turns its domain errors into an HTML error page with the status the JSON API would have
answered.
"""

from __future__ import annotations

import logging
import re
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import jinja2
from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.datastructures import FormData

from t3ar.clients.retriever import RetrieverClient
from t3ar.errors import T3arError
from t3ar_services.api.console.session import SESSION_COOKIE, Session, Sessions
from t3ar_services.api.deps import ApiState
from t3ar_services.api.domain import access
from t3ar_services.api.errors import classify

log = logging.getLogger(__name__)
T = TypeVar("T")

PREFIX = "/ui"
HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"
# No inline script or style anywhere: scripts and styles come from /ui/static only; images from this origin or
# data: URIs (a searched image, re-encoded by us); forms post only here; no framing.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
       "frame-ancestors 'none'; base-uri 'none'; connect-src 'self'")
SECURITY_HEADERS = [(b"content-security-policy", CSP.encode()), (b"x-content-type-options", b"nosniff"),
                    (b"x-frame-options", b"DENY"), (b"referrer-policy", b"same-origin")]


def _segment(value: object) -> str:
    """One URL path segment, whatever the value holds (``/``, ``?``, ``..``)."""
    return urllib.parse.quote(str(value), safe="")


def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["seg"] = _segment
    return env


TEMPLATES = _env()


class NeedSignIn(Exception):
    """Answered with a redirect to the sign-in page; ``ended``: why the session's cookie stopped working
    (``revoked``, ``expired``), which that page says."""

    def __init__(self, next_path: str, ended: str | None = None) -> None:
        self.next_path = next_path
        self.ended = ended


class PageError(Exception):
    """Rendered as the error page with this status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def sessions(request: Request) -> Sessions:
    found: Sessions = request.app.state.console_sessions
    return found


def api_state(request: Request) -> ApiState:
    state: ApiState = request.app.state.api
    return state


def pool_reader(request: Request) -> RetrieverClient:
    """The API's retriever client for a page: one attempt, at most ``T3AR_API_CONSOLE_TIMEOUT`` seconds (a
    page says the retriever is down within seconds, where the JSON API's client waits and retries)."""
    state = api_state(request)
    return state.retriever.bounded(state.settings.console_timeout)


def current_session(request: Request) -> Session:
    """The request's session, or :class:`NeedSignIn` (answered with a redirect to the sign-in page)."""
    cookie = request.cookies.get(SESSION_COOKIE)
    found = sessions(request).read(cookie)
    if found is None:
        raise NeedSignIn(request.url.path, sessions(request).ended(cookie))
    return found


SessionDep = Annotated[Session, Depends(current_session)]


def refused(request: Request | None, session: Session, action: str, error: PageError, target: str = "") -> \
        PageError:
    """``error``, recorded first in the audit log as a refused ``action`` with its status and reason (not
    recorded without a request or an action)."""
    if request is not None and action:
        access.record(api_state(request), session.who, action, target, client_of(request), outcome="refused",
                      detail=f"{error.status}: {error.message[:400]}")
    return error


def require_admin(session: Session, what: str = "withdrawing pool items", *, request: Request | None = None,
                  action: str = "", target: str = "") -> None:
    """403 unless the session is an admin's; with ``request`` and ``action`` the refusal is audited."""
    if not session.admin:
        raise refused(request, session, action, PageError(
            403, f"{what} needs the admin token (T3AR_API_ADMIN_TOKEN) or an admin key: sign in with it"), target)


def require_submit(session: Session, *, request: Request | None = None, action: str = "", target: str = "") -> None:
    """403 for a key that may only read; with ``request`` and ``action`` the refusal is audited."""
    if not session.can_submit:
        raise refused(request, session, action, PageError(
            403, "this key may only read: submitting, uploading, cancelling and readapting need a key with role "
                 "submit or admin"), target)


def client_of(request: Request) -> str:
    """The client's address as the API sees it (for the audit log)."""
    return request.client.host if request.client is not None else ""


def same_origin(request: Request) -> bool:
    """A browser's ``Origin`` on a POST must name this server's host (SameSite=Strict already keeps the cookie
    off cross-site requests; this refuses them before their body is read). The host only, not the scheme: behind
    a TLS proxy the browser says https while the request reaching us is http."""
    origin = request.headers.get("origin")
    if origin is None:
        return True  # not a browser's cross-origin form (those always send Origin); the CSRF token still applies
    return urllib.parse.urlsplit(origin).netloc == request.headers.get("host", "") != ""


async def checked_form(request: Request, *, max_files: int = 0,
                       needs: Callable[[Session], None] | None = None) -> tuple[Session, FormData]:
    """A POST's session (checked before the body is read, and with ``needs``, e.g. :func:`require_submit`, its
    role too: a read key's upload is refused before a byte of it is read), then its form (fields up to 64 KiB
    each; files are bounded by the API's body limit and by what reads them), whose ``csrf`` field must be the
    session's CSRF token (403 otherwise)."""
    session = current_session(request)
    if needs is not None:
        needs(session)
    if not same_origin(request):
        raise PageError(403, "cross-origin form posts are refused")
    form = await request.form(max_files=max_files, max_fields=32, max_part_size=64 * 1024)
    if not sessions(request).csrf_ok(session.nonce, form.get("csrf")):
        raise PageError(403, "missing or wrong CSRF token: reload the page and try again")
    return session, form


def call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a domain function (or a retriever client call); its domain errors become an error page with the status
    the JSON API would have answered."""
    try:
        return fn(*args, **kwargs)
    except T3arError as e:
        status, _ = classify(e)
        raise PageError(status, str(e)) from e
    except (RedisConnectionError, RedisTimeoutError) as e:
        raise PageError(503, "the job queue (Redis) is unreachable; retry shortly") from e


def render(request: Request, template: str, session: Session | None, status: int = 200, **context: Any) -> \
        HTMLResponse:
    body = TEMPLATES.get_template(template).render(session=session, prefix=PREFIX, path=request.url.path,
                                                   **context)
    return HTMLResponse(body, status_code=status)


# what a domain error tells a JSON client to do next, as the console says it: (the JSON hint, the console's words,
# the console page it links to; a group in the hint fills the page's path)
_HINTS = [
    (re.compile(r"; list jobs with GET /jobs$"), "", ("/jobs", "The jobs")),
    (re.compile(r"; (upload one with POST /models or )?list them with GET /models$"), "", ("/models", "The models")),
    (re.compile(r"; list them with GET /keys$"), "", ("/keys", "The API keys")),
    (re.compile(r":? GET /pool/(\S+)/lineage( later)?"), " (its page below)", ("/pool/{0}", "The pool item's page")),
    (re.compile(r": POST /jobs/\{id\}/readapt to run it again"), ": readapt it from its page to run it again", None),
]


def console_words(message: str) -> tuple[str, list[tuple[str, str]]]:
    """A domain error's message as the console says it: the JSON API's route hints (``GET /jobs``, ``POST
    /models``) replaced by words, with (console path, label) links to the pages that do the same."""
    links = []
    for pattern, words, page in _HINTS:
        m = pattern.search(message)
        if m is None:
            continue
        message = message[:m.start()] + words + message[m.end():]
        if page is not None:
            links.append((PREFIX + page[0].format(*(_segment(g) for g in m.groups() if g)), page[1]))
    return message, links


def error_page(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, PageError)
    if exc.status >= 500:
        log.error("console %s %s: %s", request.method, request.url.path, exc.message)
    session = sessions(request).read(request.cookies.get(SESSION_COOKIE))
    message, links = console_words(exc.message)
    return render(request, "error.html", session, status=exc.status, status_code=exc.status, message=message,
                  links=links)


# SameSite=Strict keeps the cookie off a navigation that came from another site (a link in a chat or a ticket),
# so such a visit looks signed out. This page reloads the same URL from our own origin, which sends the cookie;
# signed out for real, the reload is same-origin and goes on to the sign-in page.
_RELOAD = ('<!doctype html><meta charset="utf-8"><meta http-equiv="refresh" content="0">'
           '<title>t3ar</title><p>Loading…</p>')


def sign_in_redirect(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, NeedSignIn)
    if request.method == "GET" and request.headers.get("sec-fetch-site") == "cross-site":
        return HTMLResponse(_RELOAD)
    target = exc.next_path if request.method == "GET" else f"{PREFIX}/jobs"
    ended = f"&ended={exc.ended}" if exc.ended else ""
    return RedirectResponse(f"{PREFIX}/login?next={urllib.parse.quote(target, safe='/')}{ended}", status_code=303)


_NEXT = re.compile(r"/ui/[A-Za-z0-9._~!$&'()*+,;=@%/?-]*")  # printable URL characters: no scheme, no host


def safe_next(value: str | None) -> str:
    """Where to go after signing in: a console path only (never another site, a scheme or a header break)."""
    if value and _NEXT.fullmatch(value) and "//" not in value and not value.startswith(PREFIX + "/login"):
        return value
    return f"{PREFIX}/jobs"

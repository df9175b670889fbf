"""Credentials before bodies.

FastAPI reads and parses a request's body (a multipart upload, a JSON document) before the route's
dependencies run, so a route's bearer check alone lets a client without a token make the server read a
200 MiB upload, or answer 422 for malformed JSON, before it is told 401. This ASGI middleware answers 401
first, for every request that carries a body without a known token, before anything reads the body, and
403 for a known token without the scope the route needs (``needs``: the route's scope, from its auth
dependency; e.g. the worker token on ``POST /adapt``), with the rule and words of
:func:`scope_refusal` (here, below the route checks of :mod:`t3ar_services.common.auth`, which use it too). The
routes' own dependencies check again.

One rule for a repeated ``Authorization`` header, on every path but the open ones: 400, whatever the values
(a parser that takes the first and one that takes the last would otherwise disagree).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterable
from typing import Literal

from pydantic import SecretStr
from starlette.types import ASGIApp, Receive, Send
from starlette.types import Scope as AsgiScope

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})

Scope = Literal["read", "token", "admin", "worker"]  # read: an API key that may only read (``token`` may submit)

WORKER_ELSEWHERE = ("the worker token opens only the worker routes (/internal/...); use the user or admin token")


def scope_refusal(have: Scope, need: Scope, message: str = "") -> str | None:
    """The one scope rule (routes and the credentials-first middleware): why a token of scope ``have`` may not
    use a route that needs ``need`` (``message``: the route's words for a missing admin/worker scope), or None."""
    if need == "worker":
        return None if have == "worker" else message or "this route needs the worker token"
    if have == "worker":
        return WORKER_ELSEWHERE
    if need == "admin" and have != "admin":
        return message or "this route needs the admin token"
    if need == "token" and have == "read":
        return message or "this route needs a key with role submit or admin (this key may only read)"
    return None


def token_matches(given: str, tokens: Iterable[SecretStr | None]) -> bool:
    """Whether ``given`` equals one of ``tokens`` (constant-time per token)."""
    raw = given.encode()
    return any(t is not None and secrets.compare_digest(raw, t.get_secret_value().encode()) for t in tokens)


def token_matcher(tokens: Iterable[SecretStr | None]) -> Callable[[str], bool]:
    """:func:`token_matches` against fixed ``tokens``, their bytes taken once (the check runs per request)."""
    known = [t.get_secret_value().encode() for t in tokens if t is not None]

    def accepts(given: str) -> bool:
        raw = given.encode()
        return any(secrets.compare_digest(raw, k) for k in known)

    return accepts


def bearer_problem(header: bytes | None, accepts: Callable[[str], bool]) -> str | None:
    """None when the ``Authorization`` header value carries a token that ``accepts`` knows, else why not."""
    if not header:
        return "missing bearer token: send 'Authorization: Bearer <token>'"
    scheme, _, token = header.decode("latin-1").strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return "missing bearer token: send 'Authorization: Bearer <token>'"
    return None if accepts(token.strip()) else "invalid bearer token"


DUPLICATE_AUTH = "more than one Authorization header: send exactly one ('Authorization: Bearer <token>')"


def authorization(headers: Iterable[tuple[bytes, bytes]]) -> tuple[bytes | None, bool]:
    """The request's ``Authorization`` value and whether it came more than once."""
    found: bytes | None = None
    for name, value in headers:
        if name == b"authorization":
            if found is not None:
                return found, True
            found = value
    return found, False


def _carries_body(scope: AsgiScope) -> bool:
    if scope.get("method") in BODY_METHODS:
        return True
    headers = dict(scope.get("headers") or [])
    length = headers.get(b"content-length", b"0")
    return b"transfer-encoding" in headers or (length.isdigit() and int(length) > 0)


class CredentialsFirstMiddleware:
    """401 (JSON error body, ``WWW-Authenticate: Bearer``) for a request with a body and no known bearer token,
    sent before the body is read; 403 for one whose token lacks the route's scope (``scope_of(token)`` names a
    known token's scope, ``needs(scope)`` the route's ``(scope, message)`` or None); 400 for a repeated
    ``Authorization`` header. ``accepts(token)`` says whether a token is known; ``enabled=False`` (auth
    disabled) passes everything; ``open_paths`` (health, readiness, metrics) are never checked."""

    def __init__(self, app: ASGIApp, *, accepts: Callable[[str], bool], enabled: bool,
                 open_paths: Iterable[str] = ("/health", "/ready", "/metrics"),
                 scope_of: Callable[[str], str | None] | None = None,
                 needs: Callable[[AsgiScope], tuple[str, str] | None] | None = None) -> None:
        self.app = app
        self.accepts = accepts
        self.enabled = enabled
        self.open_paths = frozenset(open_paths)
        self.scope_of = scope_of
        self.needs = needs

    def _refusal(self, scope: AsgiScope, header: bytes | None) -> tuple[int, str, str] | None:
        """(status, code, message) of the answer to send now, or None when the request may go on."""
        problem = bearer_problem(header, self.accepts)
        if problem is not None:
            return 401, "unauthorized", problem
        if self.scope_of is None or self.needs is None or header is None:
            return None
        need = self.needs(scope)
        if need is None:
            return None
        have = self.scope_of(header.decode("latin-1").strip().partition(" ")[2].strip())
        why = scope_refusal(have or "token", need[0], need[1])  # type: ignore[arg-type]
        return None if why is None else (403, "forbidden", why)

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.enabled or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        header, repeated = authorization(scope.get("headers") or [])
        refusal: tuple[int, str, str] | None = None
        if repeated:
            refusal = 400, "bad_request", DUPLICATE_AUTH
        elif _carries_body(scope):
            refusal = self._refusal(scope, header)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, code, message = refusal
        body = json.dumps({"error": {"code": code, "message": message}}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        if status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

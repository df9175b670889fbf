"""Credentials before bodies.

FastAPI reads and parses a request's body (a multipart upload, a JSON document) before the route's
dependencies run, so a route's bearer check alone lets a client without a token make the server read a
200 MiB upload, or answer 422 for malformed JSON, before it is told 401. This ASGI middleware answers 401
first, for every request that carries a body without a known token, before anything reads the body. The
routes' own dependencies still decide the scope (a read/write token on an admin route -> 403).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterable

from pydantic import SecretStr
from starlette.types import ASGIApp, Receive, Scope, Send

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


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


def _carries_body(scope: Scope) -> bool:
    if scope.get("method") in BODY_METHODS:
        return True
    headers = dict(scope.get("headers") or [])
    length = headers.get(b"content-length", b"0")
    return b"transfer-encoding" in headers or (length.isdigit() and int(length) > 0)


class CredentialsFirstMiddleware:
    """401 (JSON error body, ``WWW-Authenticate: Bearer``) for a request with a body and no known bearer token,
    sent before the body is read. ``accepts(token)`` says whether a token is known; ``enabled=False`` (auth
    disabled) passes everything; ``open_paths`` (health, readiness, metrics) are never checked."""

    def __init__(self, app: ASGIApp, *, accepts: Callable[[str], bool], enabled: bool,
                 open_paths: Iterable[str] = ("/health", "/ready", "/metrics")) -> None:
        self.app = app
        self.accepts = accepts
        self.enabled = enabled
        self.open_paths = frozenset(open_paths)

    def _known(self, scope: Scope) -> str | None:
        """None when the request may go on, else why not."""
        return bearer_problem(dict(scope.get("headers") or []).get(b"authorization"), self.accepts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.enabled or scope["path"] in self.open_paths \
                or not _carries_body(scope):
            await self.app(scope, receive, send)
            return
        problem = self._known(scope)
        if problem is None:
            await self.app(scope, receive, send)
            return
        body = json.dumps({"error": {"code": "unauthorized", "message": problem}}).encode()
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b"Bearer"), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

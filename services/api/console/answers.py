"""What every answer under ``/ui`` looks like, errors included: the console's security headers (CSP, nosniff, no
framing; pages not cached) and, for an error, the console's HTML error page.

Most console errors are already that page (:class:`~t3ar_services.api.console.web.PageError`). This middleware
covers the rest, whatever raised them: an error answered in JSON by a layer below the console (a wrong-typed
query parameter's 422, a 405, the body limit's 413) is re-rendered as the error page with the same status,
message and protocol headers (``Allow``, ``Retry-After``); an exception that nothing handled becomes a 500 page
here instead of reaching the server, which would drop the client's keep-alive connection.
"""

from __future__ import annotations

import json
import logging

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from t3ar_services.api.console.session import SESSION_COOKIE
from t3ar_services.api.console.web import PREFIX, SECURITY_HEADERS, TEMPLATES, console_words, sessions

log = logging.getLogger(__name__)
_SECURITY_NAMES = {k for k, _ in SECURITY_HEADERS}
_KEPT = {b"allow", b"retry-after", b"www-authenticate", b"x-request-id", b"connection"}  # on a re-rendered error


def error_html(scope: Scope, status: int, message: str) -> bytes:
    """The console's error page (with the signed-in navigation when the request carries a session)."""
    request = Request(scope)
    try:
        session = sessions(request).read(request.cookies.get(SESSION_COOKIE))
    except Exception:  # never let the error page fail: no navigation then
        session = None
    message, links = console_words(message)
    return TEMPLATES.get_template("error.html").render(
        session=session, prefix=PREFIX, path=scope.get("path", ""), status_code=status, message=message,
        links=links).encode()


def _message(body: bytes, status: int) -> str:
    try:
        error = json.loads(body)["error"]
        return str(error["message"])
    except (ValueError, KeyError, TypeError):
        return f"the request failed ({status})"


class ConsoleAnswersMiddleware:
    """Security headers on every answer under ``/ui``; its non-HTML errors as the HTML error page; its unhandled
    exceptions as a 500 page (logged)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not (path == PREFIX or path.startswith(PREFIX + "/")):
            await self.app(scope, receive, send)
            return
        static = path.startswith(PREFIX + "/static/")
        started = False
        held: Message | None = None  # the start of a JSON error, re-rendered once its body is complete
        body = b""

        async def start(status: int, headers: list[tuple[bytes, bytes]]) -> None:
            headers = [(k, v) for k, v in headers if k.lower() not in _SECURITY_NAMES] + SECURITY_HEADERS
            if not static and not any(k.lower() == b"cache-control" for k, _ in headers):
                headers.append((b"cache-control", b"no-store"))
            await send({"type": "http.response.start", "status": status, "headers": headers})

        async def page(status: int, message: str, kept: list[tuple[bytes, bytes]]) -> None:
            html = error_html(scope, status, message)
            await start(status, [*kept, (b"content-type", b"text/html; charset=utf-8"),
                                 (b"content-length", str(len(html)).encode())])
            await send({"type": "http.response.body", "body": html})

        async def console_send(message: Message) -> None:
            nonlocal started, held, body
            if message["type"] == "http.response.start":
                started = True
                headers = list(message.get("headers", []))
                kind = dict((k.lower(), v) for k, v in headers).get(b"content-type", b"")
                if message["status"] >= 400 and kind.startswith(b"application/json"):
                    held = message
                    return
                await start(message["status"], headers)
            elif held is not None and message["type"] == "http.response.body":
                body += message.get("body", b"")
                if not message.get("more_body", False):
                    status = held["status"]
                    await page(status, _message(body, status),
                               [(k, v) for k, v in held.get("headers", []) if k.lower() in _KEPT])
            else:
                await send(message)

        try:
            await self.app(scope, receive, console_send)
        except Exception:
            if started:
                raise
            log.exception("console %s %s failed", scope.get("method"), path)
            await page(500, "internal error: the API's log has the details", [])

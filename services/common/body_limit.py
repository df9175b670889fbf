"""The request-body limit of both services: 413 in the JSON error envelope.

Refused up front from a declared Content-Length, or cut off while streaming (chunked uploads), whatever the
route would have answered. (Not FastAPI's ``max_body_size``: that one answers a declared Content-Length over
the limit in plain text.) A route may have a tighter limit of its own (``limit_for``: e.g. the retriever's
``POST /search``, bounded by what a search of the pool can use), refused the same way before it is read.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: ``limit_for(scope)``: a route's own (limit, hint), or None for the service's
LimitFor = Callable[[Scope], tuple[int, str] | None]


class BodyLimitMiddleware:
    """413 ``payload_too_large`` for a body over ``limit`` bytes; ``hint`` ends the message (which setting
    bounds what, what to send instead)."""

    def __init__(self, app: ASGIApp, limit: int, hint: str, limit_for: LimitFor | None = None) -> None:
        self.app = app
        self.limit = limit
        self.hint = hint
        self.limit_for = limit_for

    async def _reject(self, send: Send, limit: int, hint: str) -> None:
        body = json.dumps({"error": {"code": "payload_too_large",
                                     "message": f"request body larger than {limit} bytes{hint}"}}).encode()
        await send({"type": "http.response.start", "status": 413, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, hint = (self.limit_for(scope) if self.limit_for is not None else None) or (self.limit, self.hint)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._reject(send, limit, hint)
            return
        seen = 0
        exceeded = False

        async def limited_receive() -> Message:
            nonlocal seen, exceeded
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    exceeded = True
                    raise _TooLarge()
            return message

        async def guarded_send(message: Message) -> None:
            if exceeded:  # the app answered an aborted body read (e.g. 400): replace it with our 413
                if message["type"] == "http.response.start":
                    await self._reject(send, limit, hint)
                return
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except _TooLarge:
            await self._reject(send, limit, hint)


class _TooLarge(Exception):
    pass

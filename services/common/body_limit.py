"""The request-body limit of both services: 413 in the JSON error envelope.

Refused up front from a declared Content-Length, or cut off while streaming (chunked uploads), whatever the
route would have answered. (Not FastAPI's ``max_body_size``: that one answers a declared Content-Length over
the limit in plain text.)
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyLimitMiddleware:
    """413 ``payload_too_large`` for a body over ``limit`` bytes; ``hint`` ends the message (which setting
    bounds what, what to send instead)."""

    def __init__(self, app: ASGIApp, limit: int, hint: str) -> None:
        self.app = app
        self.limit = limit
        self.hint = hint

    async def _reject(self, send: Send) -> None:
        body = json.dumps({"error": {"code": "payload_too_large",
                                     "message": f"request body larger than {self.limit} bytes{self.hint}"}}).encode()
        await send({"type": "http.response.start", "status": 413, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._reject(send)
            return
        seen = 0
        exceeded = False

        async def limited_receive() -> Message:
            nonlocal seen, exceeded
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    exceeded = True
                    raise _TooLarge()
            return message

        async def guarded_send(message: Message) -> None:
            if exceeded:  # the app answered an aborted body read (e.g. 400): replace it with our 413
                if message["type"] == "http.response.start":
                    await self._reject(send)
                return
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except _TooLarge:
            await self._reject(send)


class _TooLarge(Exception):
    pass

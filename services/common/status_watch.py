"""The status an ASGI app answered with, for middleware that act on it (request metrics, failed sign-ins)."""

from __future__ import annotations

from starlette.types import Message, Send


class StatusWatch:
    """An ASGI ``send`` that passes the app's messages on to ``send`` and keeps its response's status in
    ``status`` (``default`` until the response starts: the app raised, or the client left, before it answered)."""

    def __init__(self, send: Send, default: int) -> None:
        self._send = send
        self.status = default

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        await self._send(message)

"""The client's side of one ASGI call, for tests that call an app or a middleware directly: how often the body was
read, and what was sent back."""

from __future__ import annotations

from typing import Any


class AsgiProbe:
    """``receive`` hands out ``body`` (``more_body``: a body that never ends) and counts the reads; ``send``
    records the messages."""

    def __init__(self, body: bytes, *, more_body: bool = False) -> None:
        self.body, self.more_body = body, more_body
        self.reads = 0
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        self.reads += 1
        return {"type": "http.request", "body": self.body, "more_body": self.more_body}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

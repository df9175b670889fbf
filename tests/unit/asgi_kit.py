"""Calling an ASGI app directly with a body fed in chunks, to see how much of it the app reads before it answers
(a TestClient hands the app the whole body at once, so it cannot tell)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Answer:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    pulled: int = 0  # body bytes the app took from receive()


def call(app: Any, method: str, path: str, headers: Sequence[tuple[str, str]], *, chunk: int = 1 << 20,
         total: int | None = None, query: str = "") -> Answer:
    """``method path`` with a chunked body of ``total`` zero bytes (None: endless), ``chunk`` bytes a message."""
    answer = Answer()

    async def receive() -> dict[str, Any]:
        if answer.status:  # answered: the client would stop sending
            return {"type": "http.disconnect"}
        left = chunk if total is None else min(chunk, total - answer.pulled)
        answer.pulled += left
        more = total is None or answer.pulled < total
        return {"type": "http.request", "body": bytes(left), "more_body": more}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer.status = message["status"]
            answer.headers = {k.decode().lower(): v.decode() for k, v in message.get("headers", [])}
        elif message["type"] == "http.response.body":
            answer.body += message.get("body", b"")

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": query.encode(), "root_path": "",
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers] + [(b"host", b"testserver")],
             "client": ("127.0.0.1", 5000), "server": ("testserver", 80), "state": {}}
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 60))
    return answer

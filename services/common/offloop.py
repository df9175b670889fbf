"""Large JSON bodies are parsed off the event loop.

Starlette's ``Request.json()`` (which FastAPI's request handler awaits for a JSON body) parses on the event loop:
a body of tens of MB stalls every other request of the process (``/health`` included) for seconds.
:class:`OffLoopJsonRoute` is an ``APIRoute`` whose requests parse a body over :data:`OFFLOOP_BYTES` in the
thread pool (the parse still holds the GIL, but the interpreter switches threads every few milliseconds, so the
loop keeps answering). Bodies are bounded before this by the body-limit middleware.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool

OFFLOOP_BYTES = 1 << 20  # ~5 ms of parsing: below this a thread hop costs more than it saves


class _OffLoopJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            self._json = await run_in_threadpool(json.loads, body) if len(body) > OFFLOOP_BYTES \
                else json.loads(body)
        return self._json


class OffLoopJsonRoute(APIRoute):
    """An ``APIRoute`` (use as a router's ``route_class``) that parses large JSON bodies in the thread pool."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def offloop(request: Request) -> Response:
            return await handler(_OffLoopJsonRequest(request.scope, request.receive, request._send))

        return offloop

"""Request ids and the access log, for both services (see :mod:`t3ar.logs`).

Each request gets an id, the client's ``X-Request-ID`` when it is sane, else a new one. It is set as the
current request id for everything the request does (log lines, calls to the retriever, the job it enqueues),
returned in the response's ``X-Request-ID``, and ends the request's access-log line.
"""

from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from t3ar.logs import HEADER, REQUEST_ID, request_id_from

access = logging.getLogger("t3ar.access")
HEADER_NAME = HEADER.lower().encode()  # as it appears in an ASGI scope's headers


def log_access(method: str | None, path: str | None, status: int, seconds: float) -> None:
    """The request's access-log line (under the request's id, which the caller has set)."""
    access.info("%s %s %d %.1f ms", method, path, status, seconds * 1000)


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(HEADER_NAME)
        rid = request_id_from(given.decode("latin-1") if given is not None else None)
        token = REQUEST_ID.set(rid)
        status = 500  # unless a response starts: an exception escaping the app becomes a 500 outside
        t0 = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", []), (HEADER_NAME, rid.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            log_access(scope.get("method"), scope.get("path"), status, time.perf_counter() - t0)
            REQUEST_ID.reset(token)

"""ASGI middlewares: request timing by route template, and the request body size limit."""

from __future__ import annotations

import json
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.retriever.metrics import RetrieverMetrics


class MetricsMiddleware:
    """Times each HTTP request; the label is the matched route template (bounded cardinality)."""

    def __init__(self, app: ASGIApp, metrics: RetrieverMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        t0 = time.perf_counter()

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            label = getattr(route, "path", None) or "unmatched"
            self.metrics.request_seconds.labels(scope["method"], label, str(status)).observe(
                time.perf_counter() - t0)


class BodyLimitMiddleware:
    """413 with the JSON error body for a request body over ``limit`` bytes: refused up front from
    Content-Length, or cut off while streaming (chunked uploads), whatever the route would have answered."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    def _message(self) -> bytes:
        return json.dumps({"error": {"code": "payload_too_large", "message": (
            f"request body larger than {self.limit} bytes (T3AR_RETRIEVER_MAX_UPLOAD_BYTES); "
            "send fewer or smaller files per request")}}).encode()

    async def _reject(self, send: Send) -> None:
        body = self._message()
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

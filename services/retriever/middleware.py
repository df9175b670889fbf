"""ASGI middleware: request timing by route template (the body limit is t3ar_services.common.body_limit)."""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from t3ar_services.retriever.metrics import RetrieverMetrics


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



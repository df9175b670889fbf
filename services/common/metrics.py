"""Prometheus metrics of a service: one registry per app (several apps can live in one process), the process
and platform collectors, the request-latency histogram, and the ASGI middleware that feeds it."""

from __future__ import annotations

import time
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Histogram, PlatformCollector, ProcessCollector
from starlette.types import ASGIApp, Receive, Scope, Send

from t3ar_services.common.status_watch import StatusWatch


class ServiceMetrics:
    """``<prefix>_request_seconds`` (method, route template, status) in a fresh registry; subclasses add theirs
    to ``self.registry``."""

    def __init__(self, prefix: str, buckets: Sequence[float]) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, process_cpu_seconds_total, ...
        PlatformCollector(registry=self.registry)
        self.request_seconds = Histogram(f"{prefix}_request_seconds", "HTTP request latency",
                                         ["method", "route", "status"], buckets=buckets, registry=self.registry)


class MetricsMiddleware:
    """Times each HTTP request; the label is the matched route template (bounded cardinality)."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        watch = StatusWatch(send, 500)
        t0 = time.perf_counter()
        try:
            await self.app(scope, receive, watch)
        finally:
            route = scope.get("route")
            label = getattr(route, "path", None) or "unmatched"
            self.metrics.request_seconds.labels(scope["method"], label, str(watch.status)).observe(
                time.perf_counter() - t0)

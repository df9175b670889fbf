"""Prometheus metrics (one registry per app) and the ASGI middleware timing every request by route template."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, PlatformCollector, ProcessCollector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class ApiMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)  # process_resident_memory_bytes, process_cpu_seconds_total, open fds, ...
        PlatformCollector(registry=r)
        self.request_seconds = Histogram("t3ar_api_request_seconds", "HTTP request latency",
                                         ["method", "route", "status"], buckets=_BUCKETS, registry=r)
        self.jobs_submitted = Counter("t3ar_api_jobs_submitted", "adaptation jobs enqueued", ["method", "kind"],
                                      registry=r)
        self.uploads_rejected = Counter("t3ar_api_uploads_rejected", "uploads refused before enqueueing",
                                        ["code"], registry=r)
        self.models_uploaded = Counter("t3ar_api_models_uploaded", "base checkpoints accepted", registry=r)
        self.pool_deletes = Counter("t3ar_api_pool_deletes", "pool items withdrawn through the API", registry=r)
        self.abandoned_sweeps = Counter("t3ar_api_sweeps", "abandoned-job / lineage sweeps run", registry=r)
        self.jobs = Gauge("t3ar_api_jobs", "jobs in each rq registry (sampled at scrape)", ["state"], registry=r)
        self.workers = Gauge("t3ar_api_workers", "rq workers on the adaptation queue (sampled at scrape)",
                             registry=r)


class MetricsMiddleware:
    """Times each HTTP request; the label is the matched route template (bounded cardinality)."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
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

"""Prometheus metrics of the API (the request timing and its middleware: :mod:`t3ar_services.common.metrics`)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from t3ar_services.common.metrics import ServiceMetrics

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class ApiMetrics(ServiceMetrics):
    def __init__(self) -> None:
        super().__init__("t3ar_api", _BUCKETS)
        r = self.registry
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

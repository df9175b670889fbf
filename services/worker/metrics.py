"""The worker's Prometheus metrics: jobs by outcome, their duration and adaptation speed, and the process.

Observed in the worker's parent process after each job's work horse has ended (the job's record in Redis
says how it ended), so the parent never imports torch and a crashed work horse is still counted. Served on
``T3AR_WORKER_METRICS_PORT`` when set (:func:`serve`).
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from rq.job import Job, JobStatus

from t3ar_services.common.job_contract import JobMeta

log = logging.getLogger(__name__)

OUTCOMES = ("finished", "failed", "canceled", "refused")
_SECONDS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0)
_STEPS_PER_S = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0)


class WorkerMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)  # memory, CPU, open files of the worker's parent process
        PlatformCollector(registry=r)
        self.jobs = Counter("t3ar_worker_jobs", "jobs this worker ended, by outcome", ["outcome"], registry=r)
        self.job_seconds = Histogram("t3ar_worker_job_seconds", "wall time of a job, start to end", ["outcome"],
                                     buckets=_SECONDS, registry=r)
        self.steps_per_second = Histogram("t3ar_worker_steps_per_second",
                                          "adaptation steps per second of finished jobs", buckets=_STEPS_PER_S,
                                          registry=r)
        self.busy = Gauge("t3ar_worker_busy", "1 while a job runs", registry=r)
        for outcome in OUTCOMES:  # every series present from the start, at 0
            self.jobs.labels(outcome)

    def observe(self, job: Job, *, refused: bool = False) -> str:
        """Count ``job`` once it has ended; returns its outcome."""
        try:
            job.refresh()
        except Exception as e:  # the record may have expired or Redis gone: count what we know
            log.warning("job %s: could not read its end state (%s)", job.id, e)
        status = job.get_status(refresh=False)
        meta = JobMeta.read(job.meta)
        if refused:
            outcome = "refused"
        elif status == JobStatus.FINISHED:
            outcome = "finished"
        elif meta.canceled:
            outcome = "canceled"
        else:
            outcome = "failed"
        self.jobs.labels(outcome).inc()
        if job.started_at is not None and job.ended_at is not None:
            self.job_seconds.labels(outcome).observe(max(0.0, (job.ended_at - job.started_at).total_seconds()))
        steps, seconds = meta.steps, meta.seconds_adapt
        if outcome == "finished" and steps is not None and seconds is not None and seconds > 0:
            self.steps_per_second.observe(steps / seconds)
        return outcome


def serve(metrics: WorkerMetrics, port: int, host: str) -> Any:
    """Serve ``/metrics`` (Prometheus text format) from a daemon thread of the worker's parent; the HTTP server,
    or None. A port that cannot be bound (e.g. held by a process that inherited the socket) turns metrics off
    with an error line instead of stopping the worker: jobs matter more than metrics. (Work horses close their
    inherited copy of the socket and die with their worker, so a restarted worker finds its port free.)"""
    try:
        server, _ = start_http_server(port, addr=host, registry=metrics.registry)
    except OSError as e:
        log.error("worker metrics NOT served: cannot listen on %s:%d (%s)", host, port, e)
        return None
    log.info("worker metrics on http://%s:%d/metrics", host, port)
    return server

"""Issue 11, observability: process metrics on every service's /metrics; the worker's job metrics."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import fakeredis
from fastapi.testclient import TestClient
from prometheus_client import generate_latest
from rq import Queue
from rq.job import JobStatus

from t3ar_services.api.main import create_app
from t3ar_services.api.settings import ApiSettings
from t3ar_services.common.job_contract import JOB_FUNCTION, SERIALIZER
from t3ar_services.worker.metrics import WorkerMetrics


def _value(metrics: WorkerMetrics, name: str, **labels: str) -> float:
    got = metrics.registry.get_sample_value(name, labels)
    return 0.0 if got is None else got


def test_worker_counts_jobs_by_outcome_with_duration_and_speed() -> None:
    q = Queue("q", connection=fakeredis.FakeRedis(), serializer=SERIALIZER)
    m = WorkerMetrics()
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

    def ended(status: JobStatus, seconds: float, **meta: object) -> object:
        job = q.enqueue_call(JOB_FUNCTION, args=({},))
        job.meta.update(meta)
        job.started_at, job.ended_at = t0, t0 + dt.timedelta(seconds=seconds)
        job.set_status(status)
        job.save()
        return job

    assert m.observe(ended(JobStatus.FINISHED, 40.0, steps=20, seconds_adapt=10.0)) == "finished"  # type: ignore[arg-type]
    assert m.observe(ended(JobStatus.FAILED, 5.0, error="boom")) == "failed"  # type: ignore[arg-type]
    assert m.observe(ended(JobStatus.FAILED, 3.0, canceled=True)) == "canceled"  # type: ignore[arg-type]
    assert m.observe(ended(JobStatus.FAILED, 0.1), refused=True) == "refused"  # type: ignore[arg-type]
    for outcome in ("finished", "failed", "canceled", "refused"):
        assert _value(m, "t3ar_worker_jobs_total", outcome=outcome) == 1.0, outcome
    assert _value(m, "t3ar_worker_job_seconds_sum", outcome="finished") == 40.0
    assert _value(m, "t3ar_worker_steps_per_second_sum") == 2.0  # 20 steps in 10 s of adaptation
    assert _value(m, "t3ar_worker_steps_per_second_count") == 1.0  # failed jobs have no speed
    text = generate_latest(m.registry).decode()
    assert "process_resident_memory_bytes" in text and "process_open_fds" in text and "t3ar_worker_busy 0.0" in text


def test_api_metrics_include_the_process(tmp_path: Path) -> None:
    settings = ApiSettings(data_dir=tmp_path / "data", token="user-t", admin_token="admin-t",  # type: ignore[arg-type]
                           sweep_interval=3600)
    with TestClient(create_app(settings, redis=fakeredis.FakeRedis())) as client:
        text = client.get("/metrics").text
    for name in ("process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds", "python_info"):
        assert name in text, name


def test_retriever_metrics_include_the_process(tmp_path: Path) -> None:
    from t3ar_services.retriever.main import create_app as create_retriever
    from t3ar_services.retriever.settings import RetrieverSettings

    settings = RetrieverSettings(data_dir=tmp_path / "pool", token="rw-t", admin_token="admin-t",  # type: ignore[arg-type]
                                 embedder="none", vector_dim=8, vector_identity="synthetic")
    with TestClient(create_retriever(settings)) as client:
        text = client.get("/metrics").text
    for name in ("process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds"):
        assert name in text, name


def test_a_busy_metrics_port_does_not_stop_the_worker(caplog: object) -> None:
    import socket

    from t3ar_services.worker.metrics import serve

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert serve(WorkerMetrics(), port, "127.0.0.1") is None

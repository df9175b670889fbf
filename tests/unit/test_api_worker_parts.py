"""Worker parts without a worker process: progress throttling and cancellation, the image cache, the heartbeat
TTL, the job-spec contract, and that the worker parent never imports torch."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import fakeredis
import pytest
from rq import Queue
from rq.job import Job

from t3ar.errors import without_paths
from t3ar.method.adapt import StepStats
from t3ar_services.common.job_contract import (
    CANCEL_KEY,
    SERIALIZER,
    JobCanceledError,
    JobSpec,
    resolve_inside,
)
from t3ar_services.worker.cache import ImageCache
from t3ar_services.worker.main import AdaptWorker
from t3ar_services.worker.progress import Progress

ROOT = Path(__file__).resolve().parents[2]


def _job(redis: fakeredis.FakeRedis) -> Job:
    q = Queue("q", connection=redis, serializer=SERIALIZER)
    return q.enqueue_call("t3ar_services.worker.jobs.run_adapt_job", args=({},), job_id="j1")


def test_progress_is_throttled_and_cancellable() -> None:
    redis = fakeredis.FakeRedis()
    job = _job(redis)
    writes = 0
    original = job.save_meta

    def counting() -> None:
        nonlocal writes
        writes += 1
        original()

    job.save_meta = counting  # type: ignore[method-assign]
    p = Progress(job, redis, "j1", interval=10.0, epochs=2)
    for i in range(1, 50):
        p.step(StepStats(epoch=1, step=i, total_steps=50, lr=0.1, loss=1.0, pl_change_rate=0.2))
    assert writes <= 2  # the first write only; the rest are throttled
    p.step(StepStats(epoch=2, step=50, total_steps=50, lr=0.1, loss=0.5))
    stored = Job.fetch("j1", connection=redis, serializer=SERIALIZER).meta
    assert stored["step"] == 50 and stored["epochs"] == 2 and stored["phase"] == "adapting"
    redis.set(CANCEL_KEY.format(job_id="j1"), "1")
    p2 = Progress(job, redis, "j1", interval=0.0)
    with pytest.raises(JobCanceledError):
        p2.step(StepStats(epoch=1, step=1, total_steps=5, lr=0.1, loss=1.0))
    assert Job.fetch("j1", connection=redis, serializer=SERIALIZER).meta["canceled"] is True


def test_image_cache(tmp_path: Path) -> None:
    cache = ImageCache(tmp_path, max_bytes=25)
    for i in range(4):
        cache.put(f"pool-{i}", bytes(10))
        time.sleep(0.01)
    assert cache.get("pool-3") == bytes(10) and cache.get("missing") is None
    assert cache.forget(["pool-0", "never"]) == 1 and cache.get("pool-0") is None
    cache.trim()
    assert cache.get("pool-1") is None and cache.get("pool-3") is not None  # oldest evicted first
    assert cache.path("../../etc").is_relative_to(tmp_path)


def test_heartbeat_ttl_uses_grace() -> None:
    redis = fakeredis.FakeRedis()
    w = AdaptWorker([Queue("q", connection=redis)], connection=redis, job_monitoring_interval=2)
    w.abandon_grace = 3
    job = _job(redis)
    job.timeout = 100
    assert w.get_heartbeat_ttl(job) == 5
    job.timeout = -1
    assert w.get_heartbeat_ttl(job) == 5


def test_job_spec_contract(tmp_path: Path) -> None:
    good = {"job_id": "j1", "model_id": "m", "model_sha256": "a" * 64, "target_sha256": "b" * 64, "target_bytes": 1,
            "config": {}, "job_secret": "s" * 32, "subsample_rows": [0, 1], "subsample_sha256": "c" * 64}
    assert JobSpec.model_validate(good).target_bytes == 1
    with pytest.raises(ValueError):  # the subsample is drawn at submission: a job always carries it
        JobSpec.model_validate({k: v for k, v in good.items() if k != "subsample_rows"})
    with pytest.raises(ValueError):
        JobSpec.model_validate({**good, "job_id": "../x"})
    with pytest.raises(ValueError):
        JobSpec.model_validate({**good, "model_sha256": "A" * 64})
    with pytest.raises(ValueError, match="escapes"):
        resolve_inside(tmp_path, "../outside")
    assert resolve_inside(tmp_path, "jobs/1/target") == (tmp_path / "jobs/1/target").resolve()


def test_importing_the_worker_does_not_import_torch() -> None:
    """The parent imports torch only when it preloads (worker/preload.py, at run time), never by importing the
    worker's modules: with ``T3AR_WORKER_PRELOAD=false`` it stays free of torch."""
    code = ("import sys, t3ar_services.worker.main, t3ar_services.worker.jobs, t3ar_services.worker.transfer; "
            "print('torch' in sys.modules)")
    path = [str(ROOT / "shared"), str(ROOT), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]  # this checkout's
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={"PYTHONPATH": os.pathsep.join(p for p in path if p)}, check=True)
    assert out.stdout.strip() == "False"


def test_worker_refuses_every_job_but_the_adaptation_entry_point() -> None:
    """Issue 11, finding 1: anyone who can write to Redis could queue ``os.system``; the worker runs only
    ``JOB_FUNCTION``, and never a job's callbacks or webhooks (which the API never sets)."""
    from rq.callbacks import Callback

    from t3ar_services.common.job_contract import JOB_FUNCTION
    from t3ar_services.worker.main import refusal

    q = Queue("q", connection=fakeredis.FakeRedis(), serializer=SERIALIZER)
    assert refusal(q.enqueue_call(JOB_FUNCTION, args=({"x": 1},))) is None
    reason = refusal(q.enqueue_call("os.system", args=("touch /tmp/owned",)))
    assert reason is not None and "'os.system'" in reason
    cb = Callback("os.system")
    for job in (q.enqueue_call(JOB_FUNCTION, args=({},), on_failure=cb),
                q.enqueue_call(JOB_FUNCTION, args=({},), on_success=cb),
                q.enqueue_call(JOB_FUNCTION, args=({},), on_stopped=cb)):
        assert "callbacks" in (refusal(job) or "")


@pytest.mark.parametrize(("text", "expect"), [
    ("FileNotFoundError: [Errno 2] No such file or directory: '/srv/t3ar/jobs/ab12/target/x.png'",
     "FileNotFoundError: [Errno 2] No such file or directory: 'x.png'"),
    ("OSError: /data/api/models/.upload-1f.pt: truncated (see /var/lib/a/b)",
     "OSError: .upload-1f.pt: truncated (see b)"),
    ("cannot reach http://127.0.0.1:8001/pool/x-1 (timeout)", "cannot reach http://127.0.0.1:8001/pool/x-1 (timeout)"),
    ("fraction 1/2 of a/b relative", "fraction 1/2 of a/b relative"),
])
def test_errors_leaving_a_server_name_no_directories(text: str, expect: str) -> None:
    assert without_paths(text) == expect


def test_worker_error_message_names_no_server_path(tmp_path: Path) -> None:
    from t3ar_services.worker.jobs import _message

    try:
        (tmp_path / "jobs" / "ab" / "model.pt").read_bytes()
    except OSError as e:
        message = _message(e)
    assert str(tmp_path) not in message and message.endswith("'model.pt'") and message.startswith("FileNotFound")


def test_a_job_ended_elsewhere_takes_no_more_progress() -> None:
    """Issue 29 F6: a job failed as abandoned while its horse still runs (the horse of a killed worker, or one cut
    off from Redis) gets no more progress: the horse stops without writing."""
    from rq.job import JobStatus

    from t3ar_services.worker.progress import JobNoLongerStartedError

    redis = fakeredis.FakeRedis()
    job = _job(redis)
    job.set_status(JobStatus.STARTED)
    p = Progress(job, redis, "j1", interval=0.0)
    p.step(StepStats(epoch=1, step=549, total_steps=1000, lr=0.1, loss=1.0))
    Job.fetch("j1", connection=redis, serializer=SERIALIZER).set_status(JobStatus.FAILED)  # the API's sweep
    with pytest.raises(JobNoLongerStartedError, match="AbandonedJobError"):
        p.step(StepStats(epoch=1, step=930, total_steps=1000, lr=0.1, loss=1.0))
    assert Job.fetch("j1", connection=redis, serializer=SERIALIZER).meta["step"] == 549


def test_the_job_meta_is_the_contract_both_sides_read() -> None:
    from t3ar_services.common.job_contract import JobMeta

    redis = fakeredis.FakeRedis()
    job = _job(redis)
    p = Progress(job, redis, "j1", interval=0.0, epochs=3)
    p.phase("loading", device="cpu")
    p.step(StepStats(epoch=1, step=2, total_steps=6, lr=0.1, loss=1.25, pl_change_rate=0.5))
    with pytest.raises(ValueError):
        p.phase("retrieving", k=5)  # a field the contract does not name is refused where it is written
    p.fail("DatasetError: bad")
    meta = JobMeta.read(Job.fetch("j1", connection=redis, serializer=SERIALIZER).meta)
    progress = meta.progress()
    assert progress is not None and progress.device == "cpu" and progress.step == 2 and progress.loss == 1.25
    assert progress.epochs == 3 and meta.error == "DatasetError: bad" and meta.canceled is False
    # a field that does not fit is left out (what a job's answer shows never fails on what a worker wrote)
    odd = JobMeta.read({"step": "many", "phase": "adapting", "acceptance": {"winner": "x"}, "canceled": True})
    assert odd.step is None and odd.phase == "adapting" and odd.acceptance is None and odd.canceled is True
    assert JobMeta.read({}).progress() is None


def test_a_config_the_worker_refuses_is_the_jobs_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker validates the job's spec (and with it its config) once, at its entry, and a refusal is the job's
    one-line error."""
    import contextvars

    import rq

    from t3ar_services.common.job_contract import JobMeta
    from t3ar_services.worker.jobs import run_adapt_job

    redis = fakeredis.FakeRedis()
    job = _job(redis)
    monkeypatch.setattr(rq, "get_current_job", lambda: job)
    spec = {"job_id": "j1", "model_id": "m", "model_sha256": "a" * 64, "target_sha256": "b" * 64, "target_bytes": 1,
            "config": {"method": "no-such-method"}, "job_secret": "s" * 32, "subsample_rows": [0, 1],
            "subsample_sha256": "c" * 64}
    with pytest.raises(ValueError):  # in a context of its own: the job sets the process' request id
        contextvars.copy_context().run(run_adapt_job, spec)
    meta = JobMeta.read(Job.fetch("j1", connection=redis, serializer=SERIALIZER).meta)
    assert meta.phase == "failed" and meta.error is not None and "JobSpec" in meta.error, meta

"""Registry maintenance never runs what a job record names (t3ar_services.common.registries), on fakeredis.

A job record in Redis can name a failure callback; rq's own cleanup of abandoned jobs calls it in the cleaning
process (the API's sweep, a worker's maintenance). Ours fails the job the same way and calls nothing.
"""

from __future__ import annotations

from pathlib import Path

import fakeredis
import pytest
from rq import Callback, Queue
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry, StartedJobRegistry

from t3ar_services.common.registries import ABANDONED, clean_registries

CALLED: list[str] = []


def _named_callback(job: Job, *args: object) -> None:  # what an attacker's job record would name
    CALLED.append(job.id)


def _abandoned_job(queue: Queue) -> Job:
    """A job in `started` whose worker vanished: its execution entry in the started registry has expired."""
    job = queue.enqueue("os.getcwd", on_failure=Callback(_named_callback))
    with queue.connection.pipeline() as pipe:
        job.set_status(JobStatus.STARTED, pipeline=pipe)
        Execution.create(job, ttl=0, pipeline=pipe)
        pipe.execute()
    return job


@pytest.fixture()
def queue() -> Queue:
    CALLED.clear()
    return Queue("t3ar-test", connection=fakeredis.FakeRedis())


def test_rq_cleanup_would_run_the_named_callback(queue: Queue) -> None:
    """Why ours exists (and that the fixture reproduces the hazard)."""
    job = _abandoned_job(queue)
    StartedJobRegistry(queue=queue).cleanup()
    assert CALLED == [job.id]


def test_clean_registries_fails_abandoned_jobs_and_calls_nothing(queue: Queue, tmp_path: Path) -> None:
    job = _abandoned_job(queue)
    alive = queue.enqueue("os.getcwd")  # started, heart-beating: left alone
    with queue.connection.pipeline() as pipe:
        alive.set_status(JobStatus.STARTED, pipeline=pipe)
        Execution.create(alive, ttl=600, pipeline=pipe)
        pipe.execute()
    assert clean_registries(queue) == [job.id]
    assert CALLED == []
    job.refresh()
    assert job.get_status() == JobStatus.FAILED and job.id in FailedJobRegistry(queue=queue).get_job_ids()
    result = job.latest_result()
    assert result is not None and ABANDONED in (result.exc_string or "")
    started = StartedJobRegistry(queue=queue)
    assert started.get_job_ids(cleanup=False) == [alive.id]
    assert clean_registries(queue) == [] and CALLED == []

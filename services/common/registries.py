"""rq registry maintenance that never runs what a job record names.

rq's ``StartedJobRegistry.cleanup()`` (called by its ``clean_registries``, by a worker's periodic maintenance,
and by every registry ``count`` or ``get_job_ids()`` with the default ``cleanup=True``) fails abandoned jobs and
also calls each one's failure callback and webhooks, which the job record in Redis names, in whatever process
does the cleaning. t3ar's processes run exactly one function, the adaptation entry point (the worker refuses
every other job), so they clean with :func:`clean_registries` here and read registries with ``cleanup=False``.
t3ar's jobs carry no retries, callbacks, dependents nor rate limits: failing one is all there is to do.
"""

from __future__ import annotations

import logging

from rq import Queue
from rq.job import Job, JobStatus
from rq.job_lifecycle import record_job_failure
from rq.registry import FailedJobRegistry, FinishedJobRegistry, StartedJobRegistry
from rq.utils import current_timestamp

log = logging.getLogger(__name__)

ABANDONED = "Moved to FailedJobRegistry, due to AbandonedJobError (the worker stopped heart-beating)"


def fail_abandoned(queue: Queue) -> list[str]:
    """Fail the started jobs whose worker stopped heart-beating (what rq's cleanup persists, nothing else it
    does); their ids."""
    started = StartedJobRegistry(queue=queue)
    now = current_timestamp()
    expired = started.get_expired_job_ids(now)
    jobs = Job.fetch_many(expired, connection=queue.connection, serializer=queue.serializer) if expired else []
    swept = []
    with queue.connection.pipeline() as pipe:
        for job in jobs:
            if job is not None and job.get_status(refresh=False) == JobStatus.STARTED:
                record_job_failure(job, ABANDONED, pipe)
                swept.append(job.id)
        pipe.zremrangebyscore(started.key, 0, now)
        pipe.execute()
    for job_id in swept:
        log.warning("job %s failed: its worker stopped heart-beating (abandoned)", job_id)
    return swept


def clean_registries(queue: Queue) -> list[str]:
    """Expire finished and failed entries (rq's own cleanup, which calls nothing there) and fail abandoned jobs;
    the ids of the jobs failed as abandoned."""
    FinishedJobRegistry(queue=queue).cleanup()
    FailedJobRegistry(queue=queue).cleanup()
    return fail_abandoned(queue)

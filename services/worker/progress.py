"""Progress reporting into ``job.meta`` (throttled) and cancellation checks between steps.

The worker owns ``job.meta``, a :class:`~t3ar_services.common.job_contract.JobMeta` (the API never writes it, so
the two cannot overwrite each other); the API asks for cancellation through a separate key
(:data:`~t3ar_services.common.job_contract.CANCEL_KEY`).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import time
from typing import TYPE_CHECKING, Any

from rq.job import JobStatus

from t3ar_services.common.job_contract import CANCEL_KEY, JobCanceledError, JobMeta

if TYPE_CHECKING:
    from redis import Redis
    from rq.job import Job

    from t3ar.method.adapt import StepStats

log = logging.getLogger(__name__)


_ENDED = (JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED, JobStatus.FINISHED)


class JobNoLongerStartedError(Exception):
    """The job was ended (failed as abandoned, canceled) by someone else while this work horse ran it."""


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class Progress:
    """Writes at most one meta update per ``interval`` seconds (phase changes and the last step always go out)
    and polls the cancel key at the same rate; raises :class:`JobCanceledError` when it is set."""

    def __init__(self, job: Job | None, connection: Redis | None, job_id: str, *, interval: float = 0.5,
                 epochs: int | None = None) -> None:
        self.job = job
        self.connection = connection
        self.job_id = job_id
        self.interval = interval
        self._last_write = 0.0
        self._last_cancel_check = 0.0
        self.meta = JobMeta(pid=os.getpid(), host=socket.gethostname(), phase="starting", epochs=epochs,
                            updated_at=_now())
        self._flush()

    def _flush(self) -> None:
        self._last_write = time.monotonic()
        if self.job is None:
            return
        self._still_running()
        self.meta.updated_at = _now()
        self.job.meta.update(self.meta.dump())
        try:
            self.job.save_meta()
        except Exception as e:  # progress is best effort: a Redis hiccup must not fail the adaptation
            log.warning("could not save progress of job %s: %s", self.job_id, e)

    def _still_running(self) -> None:
        """Raise :class:`JobNoLongerStartedError` when the job's record says it is not running any more (failed as
        abandoned, e.g. while this horse's worker was cut off): it takes no more progress, and its uploads are
        refused by the API anyway. A record that cannot be read does not stop the job (best effort)."""
        assert self.job is not None
        try:
            status = self.job.get_status(refresh=True)
        except Exception:
            return
        if status in _ENDED:
            raise JobNoLongerStartedError(
                f"job {self.job_id} is {getattr(status, 'value', status)} while this work horse still ran it (an "
                "AbandonedJobError: its worker stopped heart-beating); the horse stops without writing anything")

    def _set(self, **fields: Any) -> None:
        for name, value in fields.items():
            setattr(self.meta, name, value)  # validated: only the contract's fields, with their types

    def phase(self, name: str, **fields: Any) -> None:
        """Enter a phase (loading, retrieving, adapting, saving...) with :class:`JobMeta` fields: written at
        once."""
        self._set(**fields, phase=name)
        self._flush()
        self.check_cancel(force=True)

    def check_cancel(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if self.connection is None or (not force and now - self._last_cancel_check < self.interval):
            return
        self._last_cancel_check = now
        try:
            requested = bool(self.connection.exists(CANCEL_KEY.format(job_id=self.job_id)))
        except Exception as e:
            log.warning("could not check cancellation of job %s: %s", self.job_id, e)
            return
        if requested:
            self._set(phase="canceled", canceled=True)
            self._flush()
            raise JobCanceledError(f"job {self.job_id} was canceled")

    def step(self, s: StepStats) -> None:
        """The ``on_step`` callback of the adaptation loop."""
        last = s.step >= s.total_steps
        self._set(phase="adapting", epoch=s.epoch, step=s.step, total_steps=s.total_steps, loss=round(s.loss, 5),
                  loss_ce=round(s.loss_ce, 5), loss_contrastive=round(s.loss_contrastive, 5),
                  pl_change_rate=round(s.pl_change_rate, 5), lr=s.lr)
        if last or time.monotonic() - self._last_write >= self.interval:
            self._flush()
        if not last:
            self.check_cancel()

    def fail(self, error: str) -> None:
        """The job failed: its one-line ``error`` (what the API shows), written at once."""
        self._set(phase="failed", error=error)
        self._flush()

    def done(self, **fields: Any) -> None:
        self._set(**fields, phase="done")
        self._flush()

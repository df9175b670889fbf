"""Jobs on the rq queue: enqueue, describe (status + progress + timings + error), cancel, and the periodic sweep
(abandoned jobs -> failed; finished jobs' lineage -> the index).

Status model: ``queued`` | ``started`` | ``finished`` | ``failed`` | ``canceled``. rq's own record lives for
``result_ttl``/``failure_ttl``; after that a job is ``finished`` if its artifacts exist, else ``failed``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from redis import Redis
from rq import Queue
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry, FinishedJobRegistry, StartedJobRegistry

from t3ar.acceptance_options import AcceptanceOptions
from t3ar.errors import without_paths
from t3ar.logs import REQUEST_ID
from t3ar.method.config import AdaptConfig
from t3ar_services.api.errors import ConflictError, NotFoundError
from t3ar_services.api.leftovers import Submissions
from t3ar_services.api.settings import ApiSettings
from t3ar_services.api.store import JobRow, Store
from t3ar_services.api.transfer import TargetTar
from t3ar_services.api.uploads import Subsample
from t3ar_services.common.job_contract import (
    CANCEL_KEY,
    JOB_FUNCTION,
    LINEAGE_FILE,
    REPORT_FILE,
    SERIALIZER,
    AcceptanceRecord,
    JobMeta,
    JobResult,
    JobSpec,
    Progress,
    artifacts_dir,
)
from t3ar_services.common.registries import clean_registries
from t3ar_services.common.text import check_text

log = logging.getLogger(__name__)

_STATUS = {JobStatus.QUEUED: "queued", JobStatus.DEFERRED: "queued", JobStatus.SCHEDULED: "queued",
           JobStatus.CREATED: "queued", JobStatus.STARTED: "started", JobStatus.FINISHED: "finished",
           JobStatus.FAILED: "failed", JobStatus.STOPPED: "failed", JobStatus.CANCELED: "canceled"}


def _iso(value: dt.datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.isoformat(timespec="seconds")


def explain_failure(exc_string: str | None, timeout: int) -> str:
    """A one-line reason from rq's failure record (used when the job could not write its own message)."""
    text = (exc_string or "").strip()
    if "AbandonedJobError" in text or "terminated unexpectedly" in text or "work-horse terminated" in text:
        return ("the worker running this job stopped (killed, crashed or lost its machine) before it finished; "
                "nothing was written: POST /jobs/{id}/readapt to run it again")
    if "JobTimeoutException" in text:
        return f"the job ran longer than its timeout ({timeout} s, T3AR_API_JOB_TIMEOUT) and was stopped"
    if "stopped by user" in text:
        return "the job was stopped"
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return without_paths(lines[-1])[:500] if lines else "the job failed without an error message"


@dataclass
class JobState:
    status: str
    enqueued_at: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    position: int | None = None
    worker: str | None = None
    progress: Progress | None = None
    error: str | None = None
    result: JobResult | None = None
    acceptance: AcceptanceRecord | None = None  # a job with a holdout, once its candidates were scored


class JobService:
    def __init__(self, settings: ApiSettings, store: Store, connection: Redis,
                 submissions: Submissions | None = None) -> None:
        self.settings = settings
        self.store = store
        self.connection = connection
        #: jobs whose submission is in flight: their record exists a moment before their queue record does
        self.submissions = submissions if submissions is not None else Submissions()
        self.queue = Queue(settings.queue, connection=connection, serializer=SERIALIZER)
        self._unreadable: set[str] = set()  # jobs whose lineage.json could not be indexed (logged once)

    # --- submit ------------------------------------------------------------------------------------------
    def enqueue(self, row: JobRow, config: AdaptConfig, model_sha256: str, target: TargetTar, secret: str,
                subsample: Subsample, *, holdout: TargetTar | None = None,
                acceptance: AcceptanceOptions | None = None) -> None:
        """Queue the job; the worker fetches the base model and ``target`` (and a ``holdout``, with the job's
        ``acceptance`` options) by these digests over HTTP, showing the job's ``secret`` (whose sha256 the row
        keeps), and adapts to the ``subsample`` drawn at submission. ``config``: the row's config, as the API
        validated it (not validated again here)."""
        spec = JobSpec(job_id=row.id, model_id=row.model_id, model_sha256=model_sha256, target_sha256=target.sha256,
                       target_bytes=target.size, config=config, subsample_rows=subsample.rows,
                       subsample_sha256=subsample.sha256, parent_id=row.parent_id,
                       request_id=REQUEST_ID.get(), job_secret=secret,
                       acceptance=acceptance if holdout is not None else None,
                       holdout_sha256=holdout.sha256 if holdout is not None else None,
                       holdout_bytes=holdout.size if holdout is not None else None)
        self.queue.enqueue_call(
            JOB_FUNCTION, args=(spec.model_dump(),), job_id=row.id, timeout=self.settings.job_timeout,
            result_ttl=self.settings.result_ttl, failure_ttl=self.settings.failure_ttl,
            description=f"adapt {row.model_id} ({config.method}, {row.n_images} images)")

    # --- read --------------------------------------------------------------------------------------------
    def fetch(self, job_id: str) -> Job | None:
        try:
            return Job.fetch(job_id, connection=self.connection, serializer=SERIALIZER)
        except NoSuchJobError:
            return None

    def fetch_many(self, job_ids: list[str]) -> list[Job | None]:
        return list(Job.fetch_many(job_ids, connection=self.connection, serializer=SERIALIZER)) if job_ids else []

    def state(self, row: JobRow, job: Job | None = None) -> JobState:
        job = job if job is not None else self.fetch(row.id)
        finished_on_disk = (artifacts_dir(self.settings.data_dir, row.id) / LINEAGE_FILE).is_file()
        if job is None:
            if finished_on_disk:  # rq forgot it: what a page shows of its holdout is in its report
                done = JobState("finished")
                done.acceptance = self._acceptance_on_disk(row.id)
                return done
            if row.id in self.submissions:  # recorded, not enqueued yet: a sweep must not call it failed
                return JobState("queued")
            return JobState("failed", error="the job's queue record is gone (expired or Redis was reset) and it "
                                            "left no checkpoint: POST /jobs/{id}/readapt to run it again")
        rq_status = job.get_status(refresh=False)
        meta = JobMeta.read(job.meta)
        status = _STATUS.get(rq_status, "queued") if rq_status is not None else "queued"
        if status == "failed" and meta.canceled:
            status = "canceled"
        st = JobState(status, _iso(job.enqueued_at), _iso(job.started_at), _iso(job.ended_at),
                      worker=job.worker_name or None)
        if status == "queued":
            st.position = job.get_position()
        st.progress, st.acceptance = meta.progress(), meta.acceptance
        if status == "failed":
            st.error = without_paths(meta.error or "")  # the worker's words: never where it keeps files
            if not st.error:
                result = job.latest_result()
                st.error = explain_failure(result.exc_string if result else None, self.settings.job_timeout)
            st.error = st.error.replace("{id}", row.id)
        elif status == "finished":
            st.result = JobResult.read(job.return_value())
        return st

    def _acceptance_on_disk(self, job_id: str) -> AcceptanceRecord | None:
        """The acceptance record of a finished job's stored report (None: no holdout, or no readable report)."""
        try:
            found = json.loads((artifacts_dir(self.settings.data_dir, job_id) / REPORT_FILE).read_text())
            return AcceptanceRecord.model_validate(found["acceptance"]) if found.get("acceptance") else None
        except (OSError, ValueError, TypeError, AttributeError):
            return None

    # --- cancel ------------------------------------------------------------------------------------------
    def cancel(self, row: JobRow) -> str:
        """Queued: removed from the queue at once. Started: the job stops at its next step (a few seconds).
        Returns the status after the request."""
        job = self.fetch(row.id)
        state = self.state(row, job)
        if state.status in ("finished", "failed", "canceled"):
            raise ConflictError(f"job {row.id} is already {state.status}; nothing to cancel")
        self.connection.set(CANCEL_KEY.format(job_id=row.id), "1", ex=self.settings.failure_ttl)
        if job is not None and state.status == "queued":
            try:
                job.cancel()
                return "canceled"
            except InvalidJobOperation:
                pass
        return "canceling"

    # --- sweep -------------------------------------------------------------------------------------------
    def sweep_abandoned(self) -> list[str]:
        """Fail the jobs whose worker stopped heart-beating, never running what a job record names; their ids."""
        return clean_registries(self.queue)

    def sync_lineage(self) -> int:
        """Index the lineage of every finished job not indexed yet (artifacts/<id>/lineage.json). A record that
        cannot be read or indexed is logged once and skipped: it never stops the others, nor a lineage answer."""
        root = self.settings.data_dir / "artifacts"
        if not root.is_dir():
            return 0
        known = self.store.indexed_jobs()
        n = 0
        for d in root.iterdir():
            if d.name in known or d.name in self._unreadable or not (d / LINEAGE_FILE).is_file():
                continue
            try:
                data = json.loads((d / LINEAGE_FILE).read_text())
                pool_ids = data.get("pool_ids") or []
                finished_at, sha = data.get("created_at"), data.get("checkpoint_sha256")
                if not isinstance(pool_ids, list) or not all(isinstance(p, str) for p in pool_ids) \
                        or not isinstance(finished_at, str | None) or not isinstance(sha, str | None):
                    raise ValueError("pool_ids, created_at or checkpoint_sha256 has the wrong type")
                check_text([pool_ids, finished_at, sha], "lineage")
                self.store.index_lineage(d.name, pool_ids, finished_at=finished_at, checkpoint_sha256=sha)
            except Exception as e:
                self._unreadable.add(d.name)
                log.warning("lineage of job %s cannot be indexed (skipped until the API restarts): %s: %s", d.name,
                            type(e).__name__, e)
                continue
            n += 1
        return n

    def clean_unfinished(self) -> list[str]:
        """Remove what canceled and failed jobs left in ``artifacts/`` (a checkpoint uploaded before the end, no
        lineage.json); the ids cleaned."""
        root = self.settings.data_dir / "artifacts"
        if not root.is_dir():
            return []
        cleaned = []
        for d in root.iterdir():
            if not d.is_dir() or (d / LINEAGE_FILE).exists():
                continue
            row = self.store.get_job(d.name)
            if row is None or self.state(row).status not in ("canceled", "failed"):
                continue
            shutil.rmtree(d, ignore_errors=True)
            cleaned.append(d.name)
            log.info("removed the artifacts job %s left unfinished", d.name)
        return cleaned

    def started_ids(self) -> list[str]:
        return list(StartedJobRegistry(queue=self.queue).get_job_ids(cleanup=False))  # cleanup: sweep_abandoned

    def counts(self) -> dict[str, int]:
        # cleanup=False: rq's would run failure callbacks that job records name (t3ar_services.common.registries)
        return {"queued": self.queue.count,
                **{name: registry(queue=self.queue).get_job_count(cleanup=False) for name, registry in (
                    ("started", StartedJobRegistry), ("finished", FinishedJobRegistry),
                    ("failed", FailedJobRegistry))}}


def require_job(store: Store, job_id: str) -> JobRow:
    row = store.get_job(job_id)
    if row is None:
        raise NotFoundError(f"no job {job_id!r}; list jobs with GET /jobs")
    return row


def artifact(settings: ApiSettings, job_id: str, name: str) -> Path:
    return artifacts_dir(settings.data_dir, job_id) / name

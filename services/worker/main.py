"""The worker process: an rq worker on the adaptation queue.

Why the default forking worker: each job runs in a fresh work-horse forked from a parent that has imported
torch and the core but never ran a torch op (:mod:`t3ar_services.worker.preload`: no thread pool or CUDA
context exists to be forked, so no fork-after-torch deadlock; ``T3AR_WORKER_PRELOAD=false``: the parent
imports rq only and each horse imports torch itself), and every job gets a clean process whose memory is
returned when it ends. A crashed work-horse is failed by the
parent at once; a dead parent (machine loss, SIGKILL) stops heart-beating and the job is failed as abandoned
``monitor_interval + abandon_grace`` seconds later by whoever cleans the started-job registry (the API does
so every few seconds). A work horse dies with its parent (a parent-death signal), so a killed worker never
leaves its job running, writing progress or holding the metrics port. Run it with
``python -m t3ar_services.worker`` (or ``t3ar worker``).

Start-up checks (:func:`preflight`): Redis answers, and the API answers its worker route with this worker's
token (the job's inputs and checkpoint travel through it); otherwise the worker exits with status 2 and one
line naming the setting to fix. The container health check (``check``) asks the same of the API.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from typing import Any

from redis import Redis
from rq import Queue, Worker, worker_registration
from rq.job import Job
from rq.utils import now

from t3ar.logs import configure_logging
from t3ar.urls import redact_url
from t3ar_services.common.job_contract import JOB_FUNCTION, SERIALIZER
from t3ar_services.common.lifeline import die_with_parent
from t3ar_services.common.private import keep_private
from t3ar_services.common.registries import clean_registries
from t3ar_services.worker import phases
from t3ar_services.worker.metrics import WorkerMetrics
from t3ar_services.worker.metrics import serve as serve_metrics
from t3ar_services.worker.preload import PreloadError, check_untouched, preload
from t3ar_services.worker.settings import WorkerSettings

log = logging.getLogger(__name__)


class StartupError(Exception):
    """A dependency of the worker is missing or misconfigured; the message names the setting."""


def preflight(settings: WorkerSettings) -> Redis:
    """Redis answers and the API takes our worker token; the Redis connection, or :class:`StartupError`."""
    from t3ar.clients.api import ApiAuthError, ApiError
    from t3ar_services.worker.transfer import WorkerApiClient

    try:
        conn = Redis.from_url(settings.redis_url, socket_connect_timeout=5)
        conn.ping()
    except Exception as e:
        raise StartupError(f"Redis at {redact_url(settings.redis_url)} (T3AR_WORKER_REDIS_URL) does not answer: "
                           f"{type(e).__name__}: {e}") from e
    token = settings.api_token.get_secret_value() if settings.api_token else None
    try:
        with WorkerApiClient(settings.api_url, token, timeout=10, retries=settings.api_retries) as api:
            queue = api.ping().get("queue")
    except ApiAuthError as e:
        what = "no worker token is set (T3AR_WORKER_API_TOKEN)" if token is None else \
            "T3AR_WORKER_API_TOKEN is not the API's worker token (T3AR_API_WORKER_TOKEN)"
        raise StartupError(f"the API at {settings.api_url} refused this worker: {what}; {e}") from e
    except ApiError as e:
        raise StartupError(f"the API at {settings.api_url} (T3AR_WORKER_API_URL) cannot be used: {e}") from e
    if queue and queue != settings.queue:
        log.warning("the API enqueues on %r but this worker listens on %r (T3AR_WORKER_QUEUE)", queue, settings.queue)
    return conn


class RefusedJobError(Exception):
    """A job this worker does not run (see :func:`refusal`)."""


def refusal(job: Job) -> str | None:
    """Why this worker refuses ``job``, or None. It runs exactly one function, the adaptation entry point, and
    never a callback or webhook (the API sets none): anything else on the queue was put there by someone
    else with access to Redis, and running it would run their code as the worker."""
    try:
        name = job.func_name
    except Exception as e:  # undecodable job data
        return f"its data cannot be read ({type(e).__name__})"
    if name != JOB_FUNCTION:
        return f"it names the function {name!r}; this worker runs only {JOB_FUNCTION}"
    if job._success_callback_name or job._failure_callback_name or job._stopped_callback_name or job.webhooks:
        return "it carries callbacks or webhooks, which t3ar never sets"
    return None


class AdaptWorker(Worker):
    """rq's forking worker that runs only the adaptation entry point (:func:`refusal`), with a configurable
    heartbeat grace (rq hard-codes 60 s) so an abandoned job is detected ``monitor_interval + abandon_grace``
    seconds after its worker vanished."""

    abandon_grace: int = 60
    metrics: WorkerMetrics | None = None
    metrics_server: Any = None  # the parent's /metrics HTTP server (its socket is inherited by work horses)
    _supervisor: int = 0  # the pid of the process forking work horses

    def fork_work_horse(self, job: Job, queue: Queue) -> None:
        self._supervisor = os.getpid()
        phases.mark_fork()  # the horse inherits it: the start of its job's phase table
        super().fork_work_horse(job, queue)

    def main_work_horse(self, job: Job, queue: Queue) -> None:
        """In the forked work horse, first: die with the worker (SIGKILL when the parent dies, however it dies:
        an orphaned horse would run a job the API already failed, and hold the worker's metrics port), and close
        the inherited metrics socket (the port is the parent's)."""
        die_with_parent(signal.SIGKILL, self._supervisor)
        if self.metrics_server is not None:
            try:
                self.metrics_server.socket.close()
            except OSError:
                pass
        super().main_work_horse(job, queue)

    def execute_job(self, job: Job, queue: Queue) -> Any:
        """Refused jobs go through rq's normal failure path (failed registry, error recorded) without importing
        or calling anything they name: their function is replaced by one that raises, and their callbacks and
        webhooks are dropped (the forked work horse inherits this job object)."""
        reason = refusal(job)
        if reason is not None:
            log.error("refusing job %s: %s", job.id, reason)
            job._success_callback_name = job._failure_callback_name = job._stopped_callback_name = None
            job.webhooks = []

            def refuse() -> None:
                raise RefusedJobError(f"refused: {reason}")

            job.perform = refuse  # type: ignore[method-assign]
        if self.metrics is None:
            return super().execute_job(job, queue)
        self.metrics.busy.set(1)
        try:
            return super().execute_job(job, queue)
        finally:  # the work horse has ended here: the job's record says how
            self.metrics.busy.set(0)
            self.metrics.observe(job, refused=reason is not None)

    def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
        if job.timeout and job.timeout > 0:
            remaining = job.timeout - working_time
            return int(min(remaining, self.job_monitoring_interval)) + self.abandon_grace
        return int(self.job_monitoring_interval) + self.abandon_grace

    def clean_registries(self) -> None:
        """rq's periodic maintenance, with registry cleanup that never runs a callback or webhook a job record
        names (:mod:`t3ar_services.common.registries`); rq's own would, in this process."""
        for queue in self.queues:
            if queue.acquire_maintenance_lock():
                clean_registries(queue)
                worker_registration.clean_worker_registry(queue)
                queue.intermediate_queue.cleanup(self, queue)
                queue.release_maintenance_lock()
        self.last_cleaned_at = now()  # type: ignore[assignment]  # rq declares it None

    def handle_exception(self, job: Job, *exc_info: Any) -> None:
        """A canceled job is expected: one log line instead of rq's error traceback (it still ends failed,
        with ``meta.canceled``, which the API reports as canceled)."""
        if exc_info and getattr(exc_info[0], "__name__", "") == "JobCanceledError":
            log.info("job %s canceled by request", job.id)
            return
        super().handle_exception(job, *exc_info)


def build_worker(settings: WorkerSettings, connection: Redis | None = None) -> AdaptWorker:
    conn = connection if connection is not None else Redis.from_url(settings.redis_url)
    queue = Queue(settings.queue, connection=conn, serializer=SERIALIZER)
    name = settings.name or f"{socket.gethostname()}.{os.getpid()}"
    worker = AdaptWorker([queue], connection=conn, serializer=SERIALIZER, name=name,
                         job_monitoring_interval=settings.monitor_interval)
    worker.abandon_grace = settings.abandon_grace
    worker.metrics = WorkerMetrics()
    return worker


def run(settings: WorkerSettings, *, burst: bool = False) -> bool:
    """Work until stopped (SIGTERM/SIGINT: warm shutdown after the current job; twice: abort it)."""
    conn = preflight(settings)
    try:
        if settings.preload:
            preload()
        else:
            check_untouched()
    except PreloadError as e:
        raise StartupError(f"{e}: start the worker with `python -m t3ar_services.worker` or `t3ar worker`") from e
    worker = build_worker(settings, conn)
    if settings.metrics_port and worker.metrics is not None:
        worker.metrics_server = serve_metrics(worker.metrics, settings.metrics_port, settings.metrics_host)
    log.info("worker %s on queue %s (redis %s, api %s, retriever %s, data dir %s, device %s)", worker.name,
             settings.queue, redact_url(settings.redis_url), settings.api_url, settings.retriever_url,
             settings.data_dir.resolve(), settings.device)
    result: Any = worker.work(burst=burst, logging_level=settings.log_level.upper(), with_scheduler=False)
    return bool(result)


def check(settings: WorkerSettings) -> int:
    """Container health check: Redis answers, the API takes our token and a worker of this host is registered.
    Exit status."""
    try:
        conn = preflight(settings)
        host = socket.gethostname()
        names = [w.name for w in Worker.all(connection=conn)]
    except Exception as e:
        print(f"unhealthy: {e}", file=sys.stderr)
        return 1
    if not any(n == settings.name or n.startswith(f"{host}.") for n in names):
        print(f"unhealthy: no worker of {host} registered (workers: {names})", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    settings = WorkerSettings()
    try:
        configure_logging(settings.log_level)  # T3AR_LOG_FORMAT: text or json; request ids from the jobs
    except ValueError as e:
        print(f"t3ar worker: {e}", file=sys.stderr)
        return 2
    if args and args[0] == "check":
        return check(settings)
    keep_private(settings.data_dir)  # its caches and per-job scratch (checkpoints among them) 0600
    burst = "--burst" in args
    try:
        run(settings, burst=burst)
    except StartupError as e:
        print(f"t3ar worker: {e}", file=sys.stderr)
        return 2
    return 0

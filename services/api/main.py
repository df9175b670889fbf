"""The adaptation API: ``create_app()`` (a factory: ``uvicorn --factory t3ar_services.api.main:create_app``).

Start-up: ``create_app`` builds settings -> data dir + SQLite store -> Redis connection and queue -> retriever
clients; the lifespan takes the data directory's lock (another live API serving it: refuse to start, naming its
pid) and starts a background sweeper that, every ``sweep_interval`` seconds, fails jobs whose worker stopped
heart-beating (never stuck in "started"), indexes the lineage of newly finished jobs and removes what canceled
and failed jobs uploaded. Redis or the retriever being down does not stop start-up: ``/ready`` says what is
missing and routes answer 503 until it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from redis import Redis
from starlette.concurrency import run_in_threadpool

from t3ar.clients.retriever import RetrieverClient
from t3ar_services.api.audit import AuditLog
from t3ar_services.api.compaction import Compactor
from t3ar_services.api.config_schema import document_config
from t3ar_services.api.console import PREFIX as CONSOLE_PREFIX
from t3ar_services.api.console import install_console
from t3ar_services.api.console.pages_pool import MAX_QUERY_BYTES
from t3ar_services.api.contrib_store import ContributionStore
from t3ar_services.api.contributions import Contributor
from t3ar_services.api.deps import ApiState
from t3ar_services.api.errors import install_error_handlers
from t3ar_services.api.jobs import JobService
from t3ar_services.api.keys import KeyStore
from t3ar_services.api.leftovers import Submissions, sweep_leftovers
from t3ar_services.api.metrics import ApiMetrics
from t3ar_services.api.modelreg.records import RegistrationStore
from t3ar_services.api.modelreg.registrar import Hooks, Registrar, pool_items_via
from t3ar_services.api.modelreg.settings import MlflowSettings
from t3ar_services.api.routes import ROUTERS
from t3ar_services.api.routes.jobs import ADAPT_CONFIG_FORMAT
from t3ar_services.api.settings import ApiSettings, MiB
from t3ar_services.api.store import Store
from t3ar_services.api.transfer import Artifacts
from t3ar_services.api.withdrawals import Withdrawer
from t3ar_services.common.app import create_service_app
from t3ar_services.common.auth_failures import FailureWindow
from t3ar_services.common.body_limit import RouteLimits
from t3ar_services.common.dirlock import data_dir_lifespan
from t3ar_services.common.forms import close_form_schemas
from t3ar_services.common.job_contract import WORKER_PREFIX
from t3ar_services.common.private import keep_private

log = logging.getLogger(__name__)


def _secret(value: object) -> str | None:
    return value.get_secret_value() if value is not None else None  # type: ignore[attr-defined]


def build_state(settings: ApiSettings, redis: Redis | None = None) -> ApiState:
    data = settings.data_dir
    for sub in ("models", "jobs", "artifacts"):
        (data / sub).mkdir(parents=True, exist_ok=True)
    store = Store(data / "api.sqlite3")
    conn = redis if redis is not None else Redis.from_url(settings.redis_url, socket_timeout=10,
                                                          socket_connect_timeout=5, health_check_interval=30)
    retriever = RetrieverClient(settings.retriever_url, _secret(settings.retriever_token),
                                timeout=settings.retriever_timeout, retries=1)
    admin = RetrieverClient(settings.retriever_url, _secret(settings.retriever_admin_token),
                            timeout=settings.retriever_timeout, retries=2)
    submissions = Submissions()
    jobs = JobService(settings, store, conn, submissions)
    metrics = ApiMetrics()
    registrar = Registrar(MlflowSettings(), RegistrationStore(data / "api.sqlite3"), store, data, Hooks(
        job_status=lambda job_id: _job_status(jobs, store, job_id),
        export_onnx=lambda job_id: _onnx_export(state, job_id),
        pool_items=pool_items_via(lambda pool_id: state.retriever_admin.get_item(pool_id))))
    withdrawer = Withdrawer(ContributionStore(store), lambda: state.retriever_admin, conn, metrics,
                            sync_lineage=jobs.sync_lineage, on_withdrawn=registrar.mark_stale)
    contributor = Contributor(store, data, lambda: (state.retriever, state.retriever_admin), withdrawer,
                              job_status=lambda job_id: _job_status(jobs, store, job_id))
    state = ApiState(settings=settings, store=store, redis=conn, jobs=jobs,
                     retriever=retriever, retriever_admin=admin, metrics=metrics,
                     artifacts=Artifacts(data, settings.max_model_bytes), contributor=contributor,
                     compactor=Compactor(contributor, settings.compact_timeout), withdrawer=withdrawer,
                     keys=KeyStore(data / "api.sqlite3"), submissions=submissions,
                     audit=AuditLog(data / "api.sqlite3", max_rows=settings.audit_max_rows,
                                    max_age_days=settings.audit_max_age_days,
                                    max_per_minute=settings.audit_max_per_minute),
                     registrar=registrar)
    return state


def _onnx_export(state: ApiState, job_id: str) -> Path:
    """The job's checkpoint as ONNX (made once and parity-checked, :mod:`.domain.exports`), for the registry."""
    from t3ar.export import SUFFIXES
    from t3ar_services.api.domain.exports import exported

    exported(state, job_id, "onnx")
    return state.settings.data_dir / "artifacts" / job_id / f"model{SUFFIXES['onnx']}"


def _job_status(jobs: JobService, store: Store, job_id: str) -> str:
    row = store.get_job(job_id)
    return "failed" if row is None else jobs.state(row).status


def sweep_once(state: ApiState) -> None:
    """Abandoned jobs -> failed; newly finished jobs -> lineage index; what canceled and failed jobs uploaded ->
    removed; job folders a crash left without a record -> removed. Errors are logged, never raised."""
    try:
        state.jobs.sweep_abandoned()
    except Exception as e:
        log.warning("abandoned-job sweep failed (Redis down?): %s", e)
    try:
        if n := state.jobs.sync_lineage():
            log.info("indexed the lineage of %d finished job(s)", n)
    except Exception:
        log.exception("lineage sync failed")
    try:
        state.jobs.clean_unfinished()
    except Exception as e:
        log.warning("cleaning canceled/failed jobs' artifacts failed (Redis down?): %s", e)
    try:
        sweep_leftovers(state.settings.data_dir, state.store, state.submissions)
    except Exception:
        log.exception("removing job folders a crash left failed")
    state.metrics.abandoned_sweeps.inc()


async def _sweeper(state: ApiState) -> None:
    while True:
        await run_in_threadpool(sweep_once, state)
        await asyncio.sleep(state.settings.sweep_interval)


SMALL_BODY = 64 * 1024  # every route that takes a few fields (JSON or a form): no upload, no list of thousands


def route_limits(settings: ApiSettings) -> RouteLimits:
    """The body limit of each kind of route (:func:`~t3ar_services.common.body_limit.body_size`); unmarked routes
    take a few fields."""
    form = MiB  # a multipart form's fields and boundaries around its one file
    return RouteLimits({
        "archive": (settings.max_upload_bytes + form, ": target archives are limited by T3AR_API_MAX_UPLOAD_BYTES "
                                                      "(plus 1 MiB for the form); send a smaller archive"),
        "model": (settings.max_model_bytes + form, ": checkpoints are limited by T3AR_API_MAX_MODEL_BYTES (plus "
                                                   "1 MiB for the form); send a smaller file"),
        "ingest": (settings.max_ingest_bytes + form, ": the console's pool ingest is limited by "
                                                     "T3AR_API_MAX_INGEST_BYTES (plus 1 MiB for the form); add large "
                                                     "sets with t3ar pool ingest"),
        "checkpoint": (settings.max_model_bytes, ": checkpoints are limited by T3AR_API_MAX_MODEL_BYTES"),
        "result": (settings.max_result_bytes, ": a job's result (report and lineage) is limited by "
                                              "T3AR_API_MAX_RESULT_BYTES"),
        "query_image": (MAX_QUERY_BYTES + form, f": search with an image of at most {MAX_QUERY_BYTES >> 20} MiB"),
    }, default=(SMALL_BODY, ": this route takes a few fields, not an upload"))


def create_app(settings: ApiSettings | None = None, *, redis: Redis | None = None) -> FastAPI:
    settings = settings if settings is not None else ApiSettings()
    keep_private(settings.data_dir)  # before anything is opened: databases, uploads, checkpoints 0600
    state = build_state(settings, redis)

    @asynccontextmanager
    async def _serving(app: FastAPI) -> AsyncIterator[None]:
        if not settings.auth_disabled and settings.worker_token is None:
            log.warning("T3AR_API_WORKER_TOKEN is not set: no worker can fetch a job's inputs or upload its "
                        "checkpoint, so every job will fail; set it and give it to the workers as "
                        "T3AR_WORKER_API_TOKEN")
        log.info("api: data dir %s, queue %s, retriever %s", settings.data_dir.resolve(), settings.queue,
                 settings.retriever_url)
        sweeper = asyncio.create_task(_sweeper(state), name="t3ar-api-sweeper")
        state.contributor.start(settings.sweep_interval)
        state.registrar.start(settings.sweep_interval)
        if state.registrar.enabled:
            log.info("api: finished jobs register in MLflow at %s", state.registrar.settings.links_base() or "(a "
                     "non-HTTP tracking URI)")
        try:
            yield
        finally:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            await run_in_threadpool(state.contributor.stop)
            await run_in_threadpool(state.registrar.stop)
            state.retriever.close()
            state.retriever_admin.close()
            state.redis.close()
            state.store.close()
            state.keys.close()
            state.audit.close()
            log.info("api stopped")

    # one serving API per data directory (jobs, artifacts, the SQLite records)
    lifespan = data_dir_lifespan(settings.data_dir, "this API (T3AR_API_DATA_DIR)", settings.auth_disabled,
                                 "submit jobs, download checkpoints and withdraw pool items", _serving, log)
    limits = route_limits(settings)
    failures = FailureWindow(settings.auth_failures, settings.auth_failure_window)
    app = create_service_app(
        title="t3ar adaptation API", lifespan=lifespan,
        description="Adapt a base classifier to target data with retrieval from the auxiliary pool; withdraw pool "
                    "items and find (and re-run) every checkpoint that used them.",
        form_limits={"max_files": 2, "max_fields": 16, "max_part_size": 1 << 20},  # target + holdout
        settings=settings, install_errors=install_error_handlers, metrics=state.metrics,
        body_limit=settings.max_body_bytes, body_hint=(
            ": target archives are limited by T3AR_API_MAX_UPLOAD_BYTES, checkpoints by T3AR_API_MAX_MODEL_BYTES "
            "(plus 1 MiB for the form); send a smaller file"), limit_for=limits,
        routers=ROUTERS, session_prefixes=[CONSOLE_PREFIX], failures=failures,
        sign_in_paths=[f"{CONSOLE_PREFIX}/login"], own_budget_prefixes=[WORKER_PREFIX], key_scope=state.key_scope)
    limits.attach(app)
    app.state.auth_failures = failures
    app.state.api = state
    install_console(app, settings)
    close_form_schemas(app)
    document_config(app, ADAPT_CONFIG_FORMAT)
    return app

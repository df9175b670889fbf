"""Jobs: the list, a job's page (config, progress, charts, retrieved neighbours, lineage), downloads, cancel,
readapt. Each calls the domain layer the JSON routes call (:mod:`t3ar_services.api.domain.jobs`)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response
from redis.exceptions import RedisError
from rq import Worker
from starlette.concurrency import run_in_threadpool

from t3ar.job_words import method_name, noise_words, progress_words, returned_model, unadapted
from t3ar_services.api.console import web
from t3ar_services.api.console.charts import line_chart
from t3ar_services.api.console.session import Session
from t3ar_services.api.console.thumbs import png_response, thumbnails
from t3ar_services.api.deps import links_of
from t3ar_services.api.domain import access, exports, jobs
from t3ar_services.api.schemas import JobOut, ReportOut
from t3ar_services.common.files import file_inside
from t3ar_services.common.job_contract import EpochPoint

router = APIRouter(prefix=web.PREFIX, include_in_schema=False)
RUNNING = ("queued", "started")
REFRESH_SECONDS = 3


def _duration(job: JobOut) -> str:
    if not job.started_at:
        return ""
    try:
        start = dt.datetime.fromisoformat(job.started_at)
        end = dt.datetime.fromisoformat(job.ended_at) if job.ended_at else dt.datetime.now(dt.UTC)
    except ValueError:
        return ""
    secs = max(0, int((end - start).total_seconds()))
    return f"{secs // 60} min {secs % 60} s" if secs >= 60 else f"{secs} s"


def _progress(job: JobOut) -> tuple[int, int]:
    """(value, max) of the progress bar."""
    if job.status == "finished":
        return 1, 1
    p = job.progress
    if p is not None and p.total_steps:
        return min(p.step or 0, p.total_steps), p.total_steps
    return 0, 1


def target_words(job: JobOut) -> str:
    """The target in words: how many images, and what its labels are for (a test-time job adapts without them and
    they only score it; a train-time job trains on them)."""
    words = f"{job.target.images} images"
    if job.target.labelled:
        train = job.config.mode == "train"
        words += ", labelled (trained on)" if train else \
            ", labelled (only to score it: test-time adaptation never sees the labels)"
    if job.target.skipped:
        words += f", {job.target.skipped} skipped"
    if job.target.adapted is not None:
        words += f"; adapted on {job.target.adapted}" + ("" if job.target.adapted == job.target.images else
                                                        f" of them (fraction {getattr(job.config, 'fraction', None)})")
    return words


def _workers(state: Any) -> int | None:
    """Workers listening on the adaptation queue (None when Redis does not answer)."""
    try:
        return int(Worker.count(queue=state.jobs.queue))
    except (RedisError, OSError):
        return None


def _row(job: JobOut, stale: int = 0, workers: int | None = None) -> dict[str, Any]:
    """A job as the list and its page show it: what it returned (the headline: the base model when that won its
    holdout), where it is, and ``stale``: how many of its retrieved pool items were withdrawn since."""
    value, total = _progress(job)
    return {"job": job, "method": method_name(job.config), "returned": returned_model(job),
            "unadapted": unadapted(job), "where": progress_words(job, workers), "stale": stale,
            "target": target_words(job), "duration": _duration(job), "value": value, "max": total}


@router.get("/jobs")
def jobs_page(request: Request, session: web.SessionDep, before: str | None = None) -> Response:
    state = web.api_state(request)
    if before is not None:
        web.call(access.job_for, state, session.who, before)
    page = web.call(jobs.list_jobs, state, links_of(request), 50, before, session.who.team_filter)
    running = any(j.status in RUNNING for j in page.jobs)
    workers = _workers(state) if any(j.status == "queued" for j in page.jobs) else None
    rows = [_row(j, len(jobs.supersession(state, j.id, finished=True).withdrawn) if j.status == "finished" else 0,
                 workers) for j in page.jobs]
    return web.render(request, "jobs.html", session, rows=rows, total=page.total, next_before=page.next_before,
                      refresh=REFRESH_SECONDS if running else None)


def _report(state: Any, job_id: str) -> ReportOut | None:
    """The finished job's report, or None when it is missing (the page still shows the rest)."""
    try:
        return web.call(jobs.report, state, job_id)
    except web.PageError as e:
        if e.status in (404, 409):
            return None
        raise


def _charts(report: ReportOut | None) -> list[Any]:
    if report is None:
        return []
    rows: list[EpochPoint]
    if len(report.step_history) >= 2:
        xs, rows, axis = [p.step for p in report.step_history], list(report.step_history), "step"
    else:
        xs, rows, axis = [e.epoch for e in report.epochs], report.epochs, "epoch"
    charts = [line_chart(f"loss terms by {axis}", xs, {"loss": [r.loss for r in rows],
                                                       "loss_ce": [r.loss_ce for r in rows],
                                                       "loss_contrastive": [r.loss_contrastive for r in rows]}),
              line_chart(f"pseudo-label change rate by {axis}", xs,
                         {"change rate": [r.pl_change_rate for r in rows]}, (0.0, 1.0))]
    return [c for c in charts if not c.empty]


def _accuracy(report: ReportOut | None) -> dict[str, float] | None:
    acc = report.accuracy if report is not None else None
    before = acc.before.top1 if acc is not None and acc.before is not None else None
    after = acc.after.top1 if acc is not None and acc.after is not None else None
    if before is None or after is None:
        return None
    return {"before": before, "after": after}


def _phases(report: ReportOut | None) -> list[dict[str, Any]]:
    """The report's phase table as rows (name, seconds, share of the worker total); queue wait has no share
    (it comes before the worker's total). Empty for reports made before phases existed."""
    table = (report.phases if report is not None else None) or {}
    inside = sum(v for k, v in table.items() if k != "queue_wait")
    return [{"name": name.replace("_", " "), "seconds": value,
             "share": None if name == "queue_wait" or inside <= 0 else 100.0 * value / inside}
            for name, value in table.items()]


@router.get("/jobs/{job_id}")
def job_page(request: Request, session: web.SessionDep, job_id: str) -> Response:
    state = web.api_state(request)
    web.call(access.job_for, state, session.who, job_id)
    job = web.call(jobs.describe, state, links_of(request), job_id)
    report = _report(state, job_id) if job.status == "finished" else None
    since = jobs.supersession(state, job_id, finished=job.status == "finished")
    row = _row(job, len(since.withdrawn), _workers(state) if job.status == "queued" else None)
    acc = job.acceptance or (report.acceptance if report is not None else None)
    return web.render(request, "job.html", session, job=job, row=row, report=report, charts=_charts(report),
                      acc=acc, noise=noise_words(acc) if acc is not None else None,
                      withdrawn=set(since.withdrawn),
                      accuracy=_accuracy(report), phases=_phases(report),
                      config=json.dumps(job.config.model_dump(mode="json"), indent=2, sort_keys=True),
                      neighbours=report.neighbour_sample if report is not None else [],
                      lineage=jobs.retrieved(state, job_id) if job.status == "finished" else [],
                      refresh=REFRESH_SECONDS if job.status in RUNNING else None, since=since,
                      error=web.console_words(job.error)[0] if job.error else None)


@router.get("/jobs/{job_id}/checkpoint")
def download_checkpoint(request: Request, session: web.SessionDep, job_id: str, format: str = "pt") -> FileResponse:
    """The checkpoint (``pt``) or its export (``onnx``, ``safetensors``: made on the first request, as for
    ``GET /jobs/{id}/checkpoint?format=``); an unknown format is the JSON API's 422, as a page."""
    state = web.api_state(request)
    web.call(access.job_for, state, session.who, job_id)
    got = web.call(exports.download, state, job_id, format)
    access.record(state, session.who, "job.download", job_id, web.client_of(request), detail=f"format={format[:20]}")
    headers = {"X-Checksum-Sha256": got.sha256} if got.sha256 else None
    return FileResponse(got.path, media_type=got.media_type, filename=got.filename, headers=headers)


@router.get("/jobs/{job_id}/report")
def download_report(request: Request, session: web.SessionDep, job_id: str) -> Response:
    web.call(access.job_for, web.api_state(request), session.who, job_id)
    report = web.call(jobs.report, web.api_state(request), job_id)
    return JSONResponse(report.model_dump(mode="json", exclude_unset=True),  # what GET /jobs/{id}/report answers
                        headers={"Content-Disposition": f'attachment; filename="t3ar-{job_id}-report.json"'})


@router.get("/jobs/{job_id}/target/{name:path}")
def target_image(request: Request, session: web.SessionDep, job_id: str, name: str) -> Response:
    """A thumbnail of one of the job's target images (the validated, extracted copy the API keeps)."""
    state = web.api_state(request)
    row = web.call(access.job_for, state, session.who, job_id)
    path = file_inside((state.settings.data_dir / row.target_dir).resolve(), name)
    if path is None:
        raise web.PageError(404, f"job {job_id} has no target image {name[:200]!r}")
    try:  # the extracted target never changes in place: its path, size and time name its content
        st = path.stat()
        return png_response(thumbnails(request).get(f"file:{path}:{st.st_size}:{st.st_mtime_ns}", path.read_bytes))
    except Exception as e:  # validated at upload, so unexpected: but never a 500 for one picture
        raise web.PageError(404, f"the image {path.name!r} cannot be read") from e


async def _job_action(request: Request, job_id: str, action: str) -> tuple[Session, Any]:
    """A POST on a job: the session (CSRF-checked, allowed to submit: else an audited refusal of ``action``) and
    the API state, once the job is one the session may see."""
    session, _ = await web.checked_form(request)
    web.require_submit(session, request=request, action=action, target=job_id)
    state = web.api_state(request)
    await run_in_threadpool(web.call, access.job_for, state, session.who, job_id)
    return session, state


@router.post("/jobs/{job_id}/cancel")
async def cancel(request: Request, job_id: str) -> Response:
    session, state = await _job_action(request, job_id, "job.cancel")
    status = await run_in_threadpool(web.call, jobs.cancel, state, job_id)
    await run_in_threadpool(access.record, state, session.who, "job.cancel", job_id, web.client_of(request),
                            detail=status)
    return RedirectResponse(f"{web.PREFIX}/jobs/{job_id}", status_code=303)


@router.post("/jobs/{job_id}/readapt")
async def readapt(request: Request, job_id: str) -> Response:
    session, state = await _job_action(request, job_id, "job.readapt")
    done = await run_in_threadpool(web.call, jobs.readapt, state, job_id, session.who.key_id)
    await run_in_threadpool(access.record, state, session.who, "job.readapt", done.row.id, web.client_of(request),
                            detail=f"parent={job_id}")
    return RedirectResponse(f"{web.PREFIX}/jobs/{done.row.id}", status_code=303)

"""Jobs: the list, a job's page (config, progress, charts, retrieved neighbours, lineage), downloads, cancel,
readapt. Each calls the JSON routes' own functions (:mod:`t3ar_services.api.routes_jobs`)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from t3ar_services.api import routes_jobs
from t3ar_services.api.console.charts import line_chart
from t3ar_services.api.console.web import (
    PREFIX,
    PageError,
    SessionDep,
    api_state,
    call,
    checked_form,
    png_response,
    render,
    thumbnail,
)
from t3ar_services.api.jobs import artifact, require_job
from t3ar_services.api.schemas import JobOut
from t3ar_services.common.job_contract import LINEAGE_FILE

router = APIRouter(prefix=PREFIX, include_in_schema=False)
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


def _row(job: JobOut) -> dict[str, Any]:
    value, total = _progress(job)
    return {"job": job, "method": job.config.get("method", ""), "duration": _duration(job), "value": value,
            "max": total}


@router.get("/jobs")
def jobs_page(request: Request, session: SessionDep, before: str | None = None) -> Response:
    state = api_state(request)
    page = call(routes_jobs.list_jobs, request, state, 50, before)
    rows = [_row(j) for j in page.jobs]
    running = any(j.status in RUNNING for j in page.jobs)
    return render(request, "jobs.html", session, rows=rows, total=page.total, next_before=page.next_before,
                  refresh=REFRESH_SECONDS if running else None)


def _report(state: Any, job_id: str) -> dict[str, Any] | None:
    """The finished job's report, or None when it is missing (the page still shows the rest)."""
    try:
        resp = call(routes_jobs.get_report, state, job_id)
    except PageError as e:
        if e.status in (404, 409):
            return None
        raise
    data = json.loads(bytes(resp.body))
    return data if isinstance(data, dict) else None


def _lineage(state: Any, job_id: str) -> list[str]:
    path = artifact(state.settings, job_id, LINEAGE_FILE)
    try:
        return [str(p) for p in json.loads(path.read_text()).get("pool_ids") or []]
    except (OSError, ValueError):
        return []


def _charts(report: dict[str, Any] | None) -> list[Any]:
    if not report:
        return []
    steps = report.get("step_history") or []
    epochs = report.get("epochs") or []
    if len(steps) >= 2:
        xs = [s.get("step", i) for i, s in enumerate(steps)]
        rows, axis = steps, "step"
    else:
        xs = [e.get("epoch", i) for i, e in enumerate(epochs)]
        rows, axis = epochs, "epoch"
    charts = [line_chart(f"loss terms by {axis}", xs, {k: [r.get(k) for r in rows] for k in
                                                       ("loss", "loss_ce", "loss_contrastive")}),
              line_chart(f"pseudo-label change rate by {axis}", xs, {"change rate": [r.get("pl_change_rate")
                                                                                     for r in rows]}, (0.0, 1.0))]
    return [c for c in charts if not c.empty]


def _accuracy(report: dict[str, Any] | None) -> dict[str, float] | None:
    acc = (report or {}).get("accuracy") or {}
    before, after = (acc.get("before") or {}).get("top1"), (acc.get("after") or {}).get("top1")
    if before is None or after is None:
        return None
    return {"before": float(before), "after": float(after)}


def _phases(report: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The report's phase table as rows (name, seconds, share of the worker total); queue wait has no share
    (it comes before the worker's total). Empty for reports made before phases existed."""
    table = (report or {}).get("phases") or {}
    if not isinstance(table, dict):
        return []
    inside = sum(float(v) for k, v in table.items() if k != "queue_wait" and isinstance(v, int | float))
    rows = []
    for name, value in table.items():
        if not isinstance(value, int | float):
            continue
        share = None if name == "queue_wait" or inside <= 0 else 100.0 * float(value) / inside
        rows.append({"name": name.replace("_", " "), "seconds": float(value), "share": share})
    return rows


@router.get("/jobs/{job_id}")
def job_page(request: Request, session: SessionDep, job_id: str) -> Response:
    state = api_state(request)
    job = call(routes_jobs.get_job, request, state, job_id)
    report = _report(state, job_id) if job.status == "finished" else None
    return render(request, "job.html", session, job=job, row=_row(job), report=report, charts=_charts(report),
                  accuracy=_accuracy(report), phases=_phases(report),
                  config=json.dumps(job.config, indent=2, sort_keys=True),
                  neighbours=(report or {}).get("neighbour_sample") or [],
                  lineage=_lineage(state, job_id) if job.status == "finished" else [],
                  refresh=REFRESH_SECONDS if job.status in RUNNING else None)


@router.get("/jobs/{job_id}/checkpoint")
def download_checkpoint(request: Request, session: SessionDep, job_id: str) -> FileResponse:
    return call(routes_jobs.get_checkpoint, api_state(request), job_id)


@router.get("/jobs/{job_id}/report")
def download_report(request: Request, session: SessionDep, job_id: str) -> Response:
    resp = call(routes_jobs.get_report, api_state(request), job_id)
    return Response(bytes(resp.body), media_type="application/json",
                    headers={"Content-Disposition": f'attachment; filename="t3ar-{job_id}-report.json"'})


@router.get("/jobs/{job_id}/target/{name:path}")
def target_image(request: Request, session: SessionDep, job_id: str, name: str) -> Response:
    """A thumbnail of one of the job's target images (the validated, extracted copy the API keeps)."""
    state = api_state(request)
    row = call(require_job, state.store, job_id)
    root = (state.settings.data_dir / row.target_dir).resolve()
    path = (root / name).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        raise PageError(404, f"job {job_id} has no target image {name!r}")
    return png_response(_thumb(path))


def _thumb(path: Path) -> bytes:
    try:
        return thumbnail(path.read_bytes())
    except Exception as e:  # validated at upload, so unexpected: but never a 500 for one picture
        raise PageError(404, f"the image {path.name!r} cannot be read") from e


@router.post("/jobs/{job_id}/cancel")
async def cancel(request: Request, job_id: str) -> Response:
    await checked_form(request)
    await run_in_threadpool(call, routes_jobs.cancel_job, api_state(request), job_id)
    return RedirectResponse(f"{PREFIX}/jobs/{job_id}", status_code=303)


@router.post("/jobs/{job_id}/readapt")
async def readapt(request: Request, job_id: str) -> Response:
    await checked_form(request)
    resp = await run_in_threadpool(call, routes_jobs.readapt, request, api_state(request), job_id)
    new_id = json.loads(bytes(resp.body))["id"]
    return RedirectResponse(f"{PREFIX}/jobs/{new_id}", status_code=303)

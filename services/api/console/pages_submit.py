"""Submit a job from the browser: a form over the fields of ``POST /adapt``, sent through the same domain
function (:func:`t3ar_services.api.domain.jobs.submit`) with the same checks, limits, owner and audit record.

The form's method, preset, fraction and epochs become the job's ``config`` (a JSON object of AdaptConfig fields,
validated by the domain layer as the JSON route's is); a refused submission shows the form again with the
reason and the status the JSON API would have answered, and leaves nothing behind (``jobs.submit`` cleans up).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData, UploadFile

from t3ar.acceptance import DEFAULT_RULE, RULES
from t3ar.method import registry
from t3ar.method.presets import DEFAULT_METHOD, PRESET_NAMES
from t3ar_services.api.console import web
from t3ar_services.api.console.session import Session
from t3ar_services.api.domain import access, jobs, models
from t3ar_services.common.body_limit import body_size

router = APIRouter(prefix=web.PREFIX, include_in_schema=False)

#: the form's fields; any other is refused, as ``POST /adapt`` refuses fields it does not take
FIELDS = frozenset({"csrf", "archive", "model_id", "method", "preset", "mode", "fraction", "epochs", "skip_bad_images",
                    "contribute", "holdout", "candidates", "require_gain", "winner_rule"})
TEXT_FIELDS = ("model_id", "method", "preset", "mode", "fraction", "epochs", "candidates", "winner_rule")
#: the form's mode choices: empty is the API's own (train when the target has labels.csv and the method can)
MODES = ("test", "train")


def _text(form: FormData, name: str) -> str:
    value = form.get(name)
    return value.strip() if isinstance(value, str) else ""


def _file(form: FormData, name: str) -> UploadFile | None:
    """A chosen file; a browser sends an empty part with no file name when none was chosen."""
    value = form.get(name)
    if not isinstance(value, UploadFile) or (not value.filename and value.size == 0):
        return None
    return value


def config_of(form: FormData) -> str:
    """The job's ``config`` field from the form: the method, and the preset, mode, fraction and epochs when given
    (``mode: test`` runs a labelled target test-time: its labels only score the job)."""
    config: dict[str, Any] = {"method": _text(form, "method") or DEFAULT_METHOD["test"]}
    if preset := _text(form, "preset"):
        config["preset"] = preset
    if mode := _text(form, "mode"):
        if mode not in MODES:
            raise web.PageError(422, f"mode must be test or train (or left to the target), not {mode[:40]!r}")
        config["mode"] = mode
    for name, kind in (("fraction", float), ("epochs", int)):
        if raw := _text(form, name):
            try:
                config[name] = kind(raw)
            except ValueError:
                raise web.PageError(422, f"{name} must be a {'number' if kind is float else 'whole number'}, "
                                     f"not {raw[:40]!r}") from None
    return json.dumps(config)


def _page(request: Request, session: Session, *, status: int = 200, error: str | None = None,
          values: dict[str, str] | None = None) -> Response:
    state = web.api_state(request)
    found = web.call(models.list_models, state, session.who.team_filter)
    values = values or {}
    return web.render(request, "submit.html", session, status=status, error=error, models=found,
                      methods=registry.names(), presets=PRESET_NAMES, modes=MODES, default_rule=DEFAULT_RULE,
                      other_rules=[r for r in RULES if r != DEFAULT_RULE],
                      values={**dict.fromkeys(TEXT_FIELDS, ""), **values},
                      checked={k for k, v in values.items() if v == "on"})


@router.get("/submit")
def submit_page(request: Request, session: web.SessionDep) -> Response:
    web.require_submit(session)
    return _page(request, session, values={"method": DEFAULT_METHOD["test"]})


@router.post("/submit", dependencies=[body_size("archive")])
async def submit(request: Request) -> Response:
    state = web.api_state(request)
    session, form = await web.checked_form(  # a read key is refused before its body is read (N11)
        request, max_files=2, needs=lambda s: web.require_submit(s, request=request, action="job.submit"))
    values = {k: v[:200] for k, v in form.items() if isinstance(v, str) and k in FIELDS and k != "csrf"}
    try:
        unknown = sorted(set(form.keys()) - FIELDS)
        if unknown:
            raise web.PageError(422, f"unknown form field(s) {', '.join(map(repr, unknown))}")
        archive = _file(form, "archive")
        if archive is None:
            raise web.PageError(422, "choose a target archive (a zip or tar of the target images)")
        model_id = _text(form, "model_id")
        if not model_id:
            raise web.PageError(422, "choose a base model (upload one on the Models page)")
        holdout = _file(form, "holdout")
        upload = jobs.TargetUpload(archive.file, archive.filename, model_id, config_of(form),
                                   form.get("skip_bad_images") == "on", form.get("contribute") == "on",
                                   holdout.file if holdout is not None else None,
                                   holdout.filename if holdout is not None else None, _text(form, "candidates"),
                                   form.get("require_gain") == "on", _text(form, "winner_rule"))
        await run_in_threadpool(web.call, access.check_model, state, session.who, model_id)
        done = await run_in_threadpool(web.call, jobs.submit, state, upload, access.owner(session.who))
    except web.PageError as e:
        if e.status >= 500:
            raise
        await run_in_threadpool(web.refused, request, session, "job.submit", e)
        return _page(request, session, status=e.status, error=e.message, values=values)
    await run_in_threadpool(access.record, state, session.who, "job.submit", done.row.id, web.client_of(request),
                            detail=f"model={model_id}")
    return RedirectResponse(f"{web.PREFIX}/jobs/{done.row.id}", status_code=303)  # a reload re-posts nothing

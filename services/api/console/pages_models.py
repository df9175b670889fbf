"""Base models: the list and an upload form, through the domain layer the JSON routes call
(:mod:`t3ar_services.api.domain.models`)."""

from __future__ import annotations

import urllib.parse

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from t3ar_services.api.console import web
from t3ar_services.api.domain import access, models
from t3ar_services.api.uploads import sent_name
from t3ar_services.common.body_limit import body_size

router = APIRouter(prefix=web.PREFIX, include_in_schema=False)


@router.get("/models")
def models_page(request: Request, session: web.SessionDep, uploaded: str | None = None, created: bool = False) -> \
        Response:
    found = web.call(models.list_models, web.api_state(request), session.who.team_filter)
    just = next((m for m in found if m.id == uploaded), None)
    return web.render(request, "models.html", session, models=found, uploaded=just, created=created)


@router.post("/models", dependencies=[body_size("model")])
async def upload(request: Request) -> Response:
    state = web.api_state(request)
    session, form = await web.checked_form(  # a read key is refused before its body is read (N11)
        request, max_files=1, needs=lambda s: web.require_submit(s, request=request, action="model.upload"))
    try:
        file = form.get("file")
        if file is None or isinstance(file, str):
            raise web.PageError(422, "choose a checkpoint file (t3ar train-source writes one)")
        name = form.get("name")
        name = name if isinstance(name, str) else ""
        if len(name) > 200:
            raise web.PageError(422, "a model name is at most 200 characters")
        done = await run_in_threadpool(web.call, models.upload, state, file.file, name or (file.filename or ""),
                                       sent_name(file.filename, "the checkpoint"), access.owner(session.who))
    except web.PageError as e:
        if e.status < 500:
            await run_in_threadpool(web.refused, request, session, "model.upload", e)
        raise
    await run_in_threadpool(access.record, state, session.who, "model.upload", done.model.id, web.client_of(request),
                            detail="new" if done.created else "again")
    query = urllib.parse.urlencode({"uploaded": done.model.id, "created": "true" if done.created else "false"})
    return RedirectResponse(f"{web.PREFIX}/models?{query}", status_code=303)  # a reload re-posts nothing

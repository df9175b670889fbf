"""Base models: the list and an upload form, through the JSON routes' own functions (``GET/POST /models``)."""

from __future__ import annotations

import json

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from t3ar_services.api import routes
from t3ar_services.api.console.web import PREFIX, PageError, SessionDep, api_state, call, checked_form, render

router = APIRouter(prefix=PREFIX, include_in_schema=False)


@router.get("/models")
def models_page(request: Request, session: SessionDep) -> Response:
    models = call(routes.list_models, api_state(request)).models
    return render(request, "models.html", session, models=models, uploaded=None)


@router.post("/models")
async def upload(request: Request) -> Response:
    state = api_state(request)
    session, form = await checked_form(request, max_files=1, max_part_size=state.settings.max_model_bytes)
    file = form.get("file")
    if file is None or isinstance(file, str):
        raise PageError(422, "choose a checkpoint file (t3ar train-source writes one)")
    name = form.get("name")
    name = name if isinstance(name, str) else ""
    if len(name) > 200:
        raise PageError(422, "a model name is at most 200 characters")
    resp = await run_in_threadpool(call, routes.upload_model, state, file, name)
    uploaded = json.loads(bytes(resp.body))
    models = (await run_in_threadpool(call, routes.list_models, state)).models
    return render(request, "models.html", session, models=models, uploaded=uploaded,
                  created=resp.status_code == 201)

"""Base models: upload, list, describe (:mod:`t3ar_services.api.domain.models`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, UploadFile
from fastapi.responses import JSONResponse

from t3ar_services.api import schemas as s
from t3ar_services.api.deps import USER, ClientDep, PrincipalDep, StateDep, SubmitterDep
from t3ar_services.api.domain import access, models
from t3ar_services.api.uploads import sent_name
from t3ar_services.common.body_limit import body_size
from t3ar_services.common.forms import only_fields

# What JSON Schema cannot state about the upload: the file part is a t3ar checkpoint (the torch zip that
# `t3ar train-source` writes), named by this media type in the document.
CHECKPOINT_MEDIA_TYPE = "application/vnd.t3ar.checkpoint"

router = APIRouter(responses=s.error_responses(401, 403, 404, 409, 413, 422, 503), dependencies=USER,
                   tags=["models"])


@router.post("/models", response_model=s.ModelOut, status_code=201,
             dependencies=[body_size("model"), only_fields("file", "name")],
             responses={200: {"model": s.ModelOut, "description": "the same file was uploaded before"},
                        400: {"model": s.ErrorBody, "description": "unparsable multipart body"}},
             openapi_extra={"requestBody": {"content": {"multipart/form-data": {"encoding": {
                 "file": {"contentType": CHECKPOINT_MEDIA_TYPE}}}}}})
def upload_model(state: StateDep, who: SubmitterDep, client: ClientDep,
                 file: Annotated[UploadFile, File(description="a t3ar checkpoint (t3ar train-source)")],
                 name: Annotated[str, Form(max_length=200)] = "") -> JSONResponse:
    """Upload a base checkpoint. It is loaded safely (``weights_only``) and its weights must fit the architecture
    it declares. The id derives from the file's sha256: the same file gives the same id (200 instead of 201)."""
    with access.refusals_recorded(state, who, "model.upload", client):
        done = models.upload(state, file.file, name or (file.filename or ""),
                             sent_name(file.filename, "the checkpoint"), access.owner(who))
    access.record(state, who, "model.upload", done.model.id, client, detail="new" if done.created else "again")
    return JSONResponse(done.model.model_dump(), status_code=201 if done.created else 200)


@router.get("/models", response_model=s.ModelList)
def list_models(state: StateDep, who: PrincipalDep) -> s.ModelList:
    """Your team's base models (an admin's: every team's)."""
    return s.ModelList(models=models.list_models(state, who.team_filter))


@router.get("/models/{model_id}", response_model=s.ModelOut)
def get_model(state: StateDep, who: PrincipalDep, model_id: str) -> s.ModelOut:
    access.check_model(state, who, model_id)
    return models.describe(state, model_id, who.team_filter)

"""A JSON body read by the route itself, after its own checks (FastAPI reads and validates a declared body
before any dependency runs: a route that must refuse a caller first, e.g. on a per-job secret, cannot declare
it). Validation errors answer as FastAPI's would (422 ``invalid_request``); the OpenAPI document still shows
the body's schema (:func:`json_body_doc`)."""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


async def read_json(request: Request, model: type[M]) -> M:
    """The request's body as ``model`` (its size bounded by the body limit middleware before this reads it)."""
    raw = await request.body()
    try:
        return model.model_validate_json(raw)
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("body", *err.get("loc", ()))}
                                      for err in e.errors(include_url=False)]) from e


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return _inline(defs[ref.rsplit("/", 1)[1]], defs)
        return {k: _inline(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


def json_body_doc(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` of a route that reads ``model`` with :func:`read_json`: a required JSON body of that
    schema (its definitions inlined: ``model`` must not be recursive)."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": _inline(schema, defs)}}}}

"""Multipart forms that are closed: a field the operation does not take is refused (422), not silently ignored
(a misspelt ``confg`` would otherwise run a job with default options), and the OpenAPI document says so
(``additionalProperties: false`` on the form's schema)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import Depends, FastAPI, Request

from t3ar.errors import InvalidInputError


def only_fields(*names: str) -> Any:
    """A route dependency refusing form fields other than ``names`` (FastAPI has parsed the form by then, so
    this reads Starlette's cached copy)."""

    async def check(request: Request) -> None:
        unknown = sorted(set((await request.form()).keys()) - set(names))
        if unknown:
            raise InvalidInputError(f"unknown form field(s) {', '.join(map(repr, unknown))}; this operation takes "
                                    f"{', '.join(names)}")

    return Depends(check)


def close_form_schemas(app: FastAPI) -> None:
    """Serve the app's document with ``additionalProperties: false`` on every multipart body schema."""
    generic: Callable[[], dict[str, Any]] = app.openapi
    done: list[dict[str, Any]] = []

    def openapi() -> dict[str, Any]:
        doc = generic()  # FastAPI's own, cached on the app
        if not done or done[0] is not doc:
            schemas = doc.get("components", {}).get("schemas", {})
            for item in doc.get("paths", {}).values():
                for op in item.values():
                    form = (op.get("requestBody") or {}).get("content", {}).get("multipart/form-data")
                    ref = ((form or {}).get("schema") or {}).get("$ref", "")
                    if ref.startswith("#/components/schemas/"):
                        schemas[ref.rsplit("/", 1)[1]]["additionalProperties"] = False
            done[:] = [doc]
        return doc

    app.openapi = openapi  # type: ignore[method-assign]

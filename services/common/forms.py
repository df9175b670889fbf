"""Multipart forms that are closed: a field the operation does not take is refused (422), not silently ignored
(a misspelt ``confg`` would otherwise run a job with default options), and the OpenAPI document says so
(``additionalProperties: false`` on the form's schema); and their text is UTF-8 or refused
(:func:`strict_multipart_text`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from starlette import formparsers

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


NOT_UTF8 = ("a multipart field name, field value or file name is not valid UTF-8 (it would be stored as other "
            "characters): send UTF-8")


def _strict_decode(src: bytes | bytearray, codec: str) -> str:
    """Starlette's decoding of a multipart field's name, value and file name, without its silent fallback to
    latin-1 (which stored bytes such as ``ED A0 80`` as other characters): invalid text is a 422, as in a JSON
    body. A charset Python does not know is read as UTF-8."""
    try:
        return bytes(src).decode(codec)
    except LookupError:
        pass
    except UnicodeDecodeError as e:
        raise HTTPException(422, NOT_UTF8) from e
    try:
        return bytes(src).decode("utf-8")
    except UnicodeDecodeError as e:
        raise HTTPException(422, NOT_UTF8) from e


def strict_multipart_text() -> None:
    """Make every multipart form of this process refuse invalid UTF-8 (:func:`_strict_decode`). Starlette
    offers no option for it; its one decoding function is replaced, and a test fails when Starlette stops
    calling it (tests/unit/test_forms_utf8.py)."""
    formparsers._user_safe_decode = _strict_decode

"""The adaptation config's JSON Schema in the API's document.

POST /adapt takes the config as a multipart text field holding a JSON object; its schema is the union of the
registered methods' configs (:func:`t3ar.method.config.config_adapter`), discriminated on ``method``. The document
says so with ``contentMediaType: application/json`` and a ``contentSchema`` referring to the ``AdaptConfig``
component, whose parts (one schema per method's config, and the T3AR family's groups) join the components.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from t3ar.method import config as method_config

COMPONENT = "AdaptConfig"
REF = "#/components/schemas/{model}"


def config_schemas() -> dict[str, Any]:
    """The components the config's schema needs: ``AdaptConfig`` (the union) and each schema it refers to."""
    schema = method_config.config_adapter().json_schema(ref_template=REF)
    defs = schema.pop("$defs", {})
    return {**defs, COMPONENT: schema}


def document_config(app: FastAPI, fmt: str) -> None:
    """Serve the app's document with the config's schema on every text field of format ``fmt`` (a config as
    JSON)."""
    generic: Callable[[], dict[str, Any]] = app.openapi
    done: list[dict[str, Any]] = []

    def openapi() -> dict[str, Any]:
        doc = generic()
        if not done or done[0] is not doc:
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            for name, part in config_schemas().items():
                schemas.setdefault(name, part)
            for body in list(schemas.values()):
                for prop in body.get("properties", {}).values():
                    if prop.get("format") == fmt:
                        prop.update(contentMediaType="application/json",
                                    contentSchema={"$ref": REF.format(model=COMPONENT)})
            done[:] = [doc]
        return doc

    app.openapi = openapi  # type: ignore[method-assign]

"""The ``Allow`` header of a 405.

Starlette answers a method that no route of a path accepts with the methods of the *first* route whose path
matched: ``OPTIONS /pool`` said ``Allow: POST`` although ``GET /pool`` exists, and ``PUT /pool/delete`` said
``Allow: GET`` (the methods of ``/pool/{item_id}``). RFC 9110 wants every method the resource supports; here
those are the methods the app's OpenAPI document gives the request's path.
"""

from __future__ import annotations

import re

from starlette.requests import Request

_METHODS = frozenset({"get", "put", "post", "delete", "options", "head", "patch", "trace"})


def _template(path: str) -> re.Pattern[str]:
    parts = re.split(r"(\{[^}/]+\})", path)
    return re.compile("".join("[^/]+" if p.startswith("{") else re.escape(p) for p in parts) + r"\Z")


def allowed_methods(request: Request) -> str:
    """The documented methods of the request's path, as an ``Allow`` value ("" when no documented path
    matches). A path that the document names literally (``/pool/delete``) is that resource, not an id of a
    templated one (``/pool/{item_id}``): then only the literal path counts."""
    paths: dict[str, dict[str, object]] = request.app.openapi().get("paths", {})
    path = request.url.path
    matched = [(p, ops) for p, ops in paths.items() if _template(p).match(path)]
    literal = [(p, ops) for p, ops in matched if "{" not in p]
    methods = {m.upper() for _, ops in (literal or matched) for m in ops if m in _METHODS}
    return ", ".join(sorted(methods))

"""The retriever's OpenAPI document, made exact for the pool this process serves.

FastAPI's generated document is the same for every pool, so it cannot say what only the open pool knows: its
id tag (``after`` on GET /pool must be an id of this pool), its vector dimension (query and bulk vectors), the
``k`` limit. Once the pool is open, :func:`install` serves a copy with those facts filled in, so that a
request valid by the published document is one the server accepts, and the other way round.

What JSON Schema cannot state is named instead, each by a format or extension documented here:

- ``format: t3ar-float32-rows-base64`` (``vectors_b64``): base64 of float32 little-endian rows, row-major,
  ``x-t3ar-dim`` numbers per row, 1..``x-t3ar-max-rows`` rows, every number finite and at most
  :data:`~t3ar_services.retriever.schemas.MAX_QUERY_NUMBER` in magnitude (as the JSON ``vectors``).
- ``format: t3ar-image-base64`` (``images_b64`` items): base64 of an image file the server can decode.
- ``x-t3ar-float32-rows`` (POST /pool/vectors body): ``dim``, ``max_rows``; every row finite and non-zero.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from t3ar_services.retriever.pool import MAX_SEQ
from t3ar_services.retriever.schemas import MAX_QUERY_NUMBER

F32_ROWS_B64 = "t3ar-float32-rows-base64"
IMAGE_B64 = "t3ar-image-base64"


def positive_int_regex(limit: int) -> str:
    """A regex (no anchors) for the decimal integers 1..``limit`` written without leading zeros."""
    digits = str(limit)
    alts = [f"[1-9][0-9]{{0,{len(digits) - 2}}}"] if len(digits) > 1 else []
    for i, ch in enumerate(digits):  # same length as limit: equal up to i, smaller at i, anything after
        low = "1" if i == 0 else "0"
        if ch > low:
            hi = chr(ord(ch) - 1)
            rest = len(digits) - i - 1
            alts.append(f"{digits[:i]}[{low}-{hi}]" + (f"[0-9]{{{rest}}}" if rest else ""))
    alts.append(digits)
    return "(?:" + "|".join(alts) + ")"


def id_pattern(tag: str) -> str:
    """The ids of a pool: ``<tag>-<n>``, 1 <= n < 2^63, as :meth:`Pool.parse_id` accepts them."""
    escaped = "".join(c if c.isalnum() else "\\" + c for c in tag)
    return f"^{escaped}-{positive_int_regex(MAX_SEQ)}$"


def _branch(prop: dict[str, Any], type_: str) -> dict[str, Any]:
    """The ``type_`` branch of an optional property (``anyOf: [X, null]``), or the property itself."""
    for option in prop.get("anyOf", [prop]):
        if option.get("type") == type_:
            return option
    raise KeyError(f"no {type_} branch in {prop}")


def specialise(doc: dict[str, Any], *, tag: str, dim: int, max_k: int, max_queries: int,
               max_vectors: int) -> dict[str, Any]:
    """A copy of the generic document with this pool's facts."""
    doc = copy.deepcopy(doc)
    paths = doc["paths"]
    for param in paths["/pool"]["get"].get("parameters", []):
        if param["name"] == "after":
            _branch(param["schema"], "string")["pattern"] = id_pattern(tag)

    search = doc["components"]["schemas"]["SearchRequest"]["properties"]
    search["k"].update(minimum=1, maximum=max_k)
    rows = _branch(search["vectors"], "array")
    rows.update(minItems=1, maxItems=max_queries)
    rows["items"].update(minItems=dim, maxItems=dim)
    # |x| <= MAX_QUERY_NUMBER: finite as float32, and so is every score
    rows["items"]["items"].update(minimum=-MAX_QUERY_NUMBER, maximum=MAX_QUERY_NUMBER)
    packed = _branch(search["vectors_b64"], "string")
    packed.update({"format": F32_ROWS_B64, "x-t3ar-dim": dim, "x-t3ar-max-rows": max_queries})
    images = _branch(search["images_b64"], "array")
    images.update(minItems=1, maxItems=max_queries)
    images["items"]["format"] = IMAGE_B64

    body = paths["/pool/vectors"]["post"]["requestBody"]["content"]["application/octet-stream"]["schema"]
    body["x-t3ar-float32-rows"] = {"dim": dim, "max_rows": max_vectors}
    return doc


def install(app: FastAPI, facts: Callable[[], dict[str, Any] | None]) -> None:
    """Serve ``specialise(generic, **facts())`` once ``facts()`` is known (the pool is open), else the generic
    document. Computed once per distinct set of facts."""
    generic = app.openapi
    cache: dict[tuple[Any, ...], dict[str, Any]] = {}

    def openapi() -> dict[str, Any]:
        known = facts()
        if known is None:
            return generic()
        key = tuple(sorted(known.items()))
        if key not in cache:
            cache.clear()
            cache[key] = specialise(generic(), **known)
        return cache[key]

    app.openapi = openapi  # type: ignore[method-assign]

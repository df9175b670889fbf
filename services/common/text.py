"""Text and JSON a service can hold: the one door check of both services for what clients and workers send.

Python's ``json`` takes what the services cannot store or answer with: lone surrogates (``"\\ud800"``: valid
JSON, not encodable as UTF-8, so SQLite and every JSON answer fail on it), ``NaN``/``Infinity`` (and ``1e999``,
read as infinity; a JSON answer cannot carry them), integers of thousands of digits (``ValueError``) and
documents nested deeper than the parser's recursion limit (``RecursionError``). :func:`parse_json_object`
refuses all of these with an :class:`~t3ar.errors.InvalidInputError` (a 422) naming what and where;
:func:`check_text` checks an already-parsed value; :data:`Utf8Str` is the request-model string type that
refuses a lone surrogate (FastAPI's 422).
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any

from pydantic import AfterValidator

from t3ar.errors import InvalidInputError

SURROGATE_MESSAGE = "contains a lone surrogate (\\ud800-\\udfff), which is not text: send valid UTF-8"


def _utf8(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(SURROGATE_MESSAGE) from None
    return value


#: a request-model string that is valid Unicode text (no lone surrogate)
Utf8Str = Annotated[str, AfterValidator(_utf8)]


def _problem(value: Any, where: str) -> str | None:
    """Why ``value`` (parsed JSON) cannot be stored and answered, naming the place; None if it can."""
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:  # iterative: depth is bounded by the parser, not by this walk
        item, at = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return f"{at} {SURROGATE_MESSAGE}"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return f"{at} is {item}: numbers must be finite"
        elif isinstance(item, dict):
            for k, v in item.items():
                if isinstance(k, str):
                    try:
                        k.encode("utf-8")
                    except UnicodeEncodeError:
                        return f"a key of {at} {SURROGATE_MESSAGE}"
                stack.append((v, f"{at}.{k}"))
        elif isinstance(item, list | tuple):
            stack.extend((v, f"{at}[{i}]") for i, v in enumerate(item))
    return None


def check_text(value: Any, what: str) -> None:
    """Raise :class:`InvalidInputError` when ``value`` holds a lone surrogate or a non-finite number."""
    problem = _problem(value, what)
    if problem is not None:
        raise InvalidInputError(problem)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number: numbers must be finite")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range: numbers must be finite")
    return value


def parse_json(raw: str | bytes, what: str, example: str = "") -> Any:
    """``raw`` parsed as strict JSON (see the module), else :class:`InvalidInputError` naming ``what``."""
    hint = f"; e.g. {example}" if example else ""
    try:
        value = json.loads(raw, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise InvalidInputError(f"{what} is nested too deeply to be read{hint}") from None
    except json.JSONDecodeError as e:
        raise InvalidInputError(f"{what} is not valid JSON ({e}){hint}") from None
    except (ValueError, UnicodeDecodeError) as e:  # a huge integer, NaN/Infinity, 1e999, undecodable bytes
        raise InvalidInputError(f"{what} cannot be read: {e}{hint}") from None
    check_text(value, what)
    return value


def parse_json_object(raw: str | bytes, what: str, example: str = "") -> dict[str, Any]:
    """:func:`parse_json` of a JSON object (``""`` reads as ``{}``)."""
    value = parse_json(raw or "{}", what, example)
    if not isinstance(value, dict):
        raise InvalidInputError(f"{what} must be a JSON object" + (f", e.g. {example}" if example else ""))
    return value


def readable(value: Any) -> Any:
    """``value`` with every lone surrogate replaced by U+FFFD and every non-finite number by None: a record stored
    before the door checked it (or by another writer) is still answered, never a 500."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in value)
    if isinstance(value, dict):
        return {readable(k): readable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [readable(v) for v in value]
    return value

"""Options whose value is a JSON object (``--config``, ``--metadata``): one parser, one error wording."""

from __future__ import annotations

import json
from typing import Any

import click


def json_object(raw: str, param_hint: str) -> dict[str, Any]:
    """``raw`` parsed as a JSON object, or a click usage error naming ``param_hint``."""
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as e:
        raise click.BadParameter(f"not JSON: {e}", param_hint=param_hint) from e
    if not isinstance(value, dict):
        raise click.BadParameter("must be a JSON object", param_hint=param_hint)
    return value

"""Shared test assertion: a response is the services' JSON error envelope ``{"error": {"code", "message"}}``.

Importable from every test folder (pytest puts ``tests/``, the folder of the suite's conftest, on sys.path)."""

from __future__ import annotations

from typing import Any

import httpx


def expect_error(resp: httpx.Response, status: int, code: str, fragment: str = "") -> dict[str, Any]:
    """Assert ``resp`` has ``status`` and the error envelope with ``code`` (and ``fragment`` in its message,
    case-insensitive); return the error object."""
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and body["error"]["code"] == code, body
    assert fragment.lower() in body["error"]["message"].lower(), body
    return dict(body["error"])

"""Auth matrix of the retriever: no token 401, unknown token 401, read/write token 403 on admin routes."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

if TYPE_CHECKING:
    from conftest import RetrieverProcess

RW, ADMIN = "test-rw-token", "test-admin-token"


def _call(url: str, token: str | None, method: str, path: str, **kwargs: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.request(method, url + path, headers=headers, timeout=60, **kwargs)


def test_auth_matrix(retriever_module: RetrieverProcess, make_png: Callable[..., bytes]) -> None:
    url = retriever_module.url
    png = make_png(7)
    made = _call(url, ADMIN, "POST", "/pool", files=[("files", ("a.png", make_png(3)))]).json()
    item = made["items"][0]["id"]
    victims = iter([it["id"] for it in _call(url, ADMIN, "POST", "/pool", files=[
        ("files", (f"{i}.png", make_png(i))) for i in range(20, 30)]).json()["items"]])
    user_routes: list[tuple[str, str, dict[str, Any]]] = [
        ("GET", "/stats", {}), ("GET", "/pool", {}), ("GET", f"/pool/{item}", {}), ("GET", f"/pool/{item}/image", {}),
        ("POST", "/pool/exists", {"json": {"sha256": []}}),
        ("POST", "/search", {"json": {"images_b64": [base64.b64encode(png).decode()], "k": 1}}),
        ("POST", "/embed", {"files": [("files", ("q.png", png))]}),
        ("POST", "/pool", {"files": [("files", ("p.png", png))]}),
    ]
    for method, path, kw in user_routes:
        for token, expected in ((None, 401), ("wrong-token", 401), (RW, 200), (ADMIN, 200)):
            resp = _call(url, token, method, path, **kw)
            assert resp.status_code == expected, (method, path, token, resp.text)
            if expected == 401:
                assert resp.json()["error"]["code"] == "unauthorized"
                assert resp.headers["www-authenticate"] == "Bearer"

    admin_routes: list[tuple[str, Callable[[], tuple[str, dict[str, Any]]], int]] = [
        ("DELETE", lambda: (f"/pool/{next(victims)}", {}), 200),
        ("POST", lambda: ("/pool/delete", {"json": {"ids": [next(victims)]}}), 200),
        ("POST", lambda: ("/pool/vectors?identity=x", {"content": b"\x00" * 16}), 409),  # image pool: conflict
    ]
    for method, request, admin_status in admin_routes:
        for token, expected in ((None, 401), ("wrong-token", 401), (RW, 403), (ADMIN, admin_status)):
            path, args = request()
            resp = _call(url, token, method, path, **args)
            assert resp.status_code == expected, (method, token, resp.text)
            if expected == 403:
                assert resp.json()["error"]["code"] == "forbidden" and "admin token" in resp.json()["error"]["message"]

    for path in ("/health", "/ready", "/metrics"):
        assert _call(url, None, "GET", path).status_code == 200


def test_auth_can_be_disabled_with_a_warning_and_is_required_otherwise(
        tmp_path: Path, retriever_factory: Callable[..., RetrieverProcess]) -> None:
    rp = retriever_factory(tmp_path / "open", {"T3AR_RETRIEVER_AUTH_DISABLED": "true", "T3AR_RETRIEVER_TOKEN": "",
                                               "T3AR_RETRIEVER_ADMIN_TOKEN": "", "T3AR_RETRIEVER_EMBEDDER": "none",
                                               "T3AR_RETRIEVER_VECTOR_DIM": "4",
                                               "T3AR_RETRIEVER_VECTOR_IDENTITY": "test"})
    assert _call(rp.url, None, "GET", "/stats").status_code == 200
    assert "AUTH IS DISABLED" in rp.log()
    refused = retriever_factory(tmp_path / "closed", {"T3AR_RETRIEVER_TOKEN": "", "T3AR_RETRIEVER_ADMIN_TOKEN": ""},
                                wait=None)
    assert refused.proc.wait(timeout=60) != 0
    assert "T3AR_RETRIEVER_AUTH_DISABLED=true for local use only" in refused.log()


@pytest.mark.parametrize("token", ["same", ""])
def test_bad_token_settings_are_refused(tmp_path: Path, retriever_factory: Callable[..., RetrieverProcess],
                                        token: str) -> None:
    rp = retriever_factory(tmp_path / "p", {"T3AR_RETRIEVER_TOKEN": token, "T3AR_RETRIEVER_ADMIN_TOKEN": token},
                           wait=None)
    assert rp.proc.wait(timeout=60) != 0

"""The lean ``POST /search`` path answers exactly like the route, and hands everything else to the route."""

from __future__ import annotations

import base64
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from error_envelope import expect_error
from fastapi.testclient import TestClient
from retriever_kit import vector_retriever

from t3ar_services.retriever.main import create_app
from t3ar_services.retriever.settings import RetrieverSettings

ADMIN = {"Authorization": "Bearer admin-t"}
DIM = 8


@pytest.fixture()
def app_client(tmp_path: Path) -> Iterator[tuple[TestClient, list[str], np.ndarray, object]]:
    settings = RetrieverSettings(data_dir=tmp_path / "pool", token="rw-t", admin_token="admin-t",  # type: ignore[arg-type]
                                 embedder="none", vector_dim=DIM, vector_identity="synthetic")
    app = create_app(settings)
    with TestClient(app, raise_server_exceptions=False) as client:
        deadline = time.monotonic() + 30
        while client.get("/ready").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        vecs = np.random.default_rng(0).normal(size=(40, DIM)).astype("<f4")
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        ids = client.post("/pool/vectors", headers=ADMIN, params={"identity": "synthetic", "source": "a"},
                          content=vecs[:30].tobytes()).json()["ids"]
        ids += client.post("/pool/vectors", headers=ADMIN, params={"identity": "synthetic", "source": "b"},
                           content=vecs[30:].tobytes()).json()["ids"]
        yield client, ids, vecs, app.state.retriever


def _b64(x: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(x, dtype="<f4").tobytes()).decode()


def test_lean_answers_are_the_routes_bytes(app_client: tuple[TestClient, list[str], np.ndarray, object]) -> None:
    client, ids, vecs, state = app_client
    q = vecs[:3] + 0.01
    for extra in ({}, {"exclude_ids": ids[:2] + ["junk"]}, {"source": "b"}, {"r": 3, "seed": 7, "k": 4},
                  {"identity": "synthetic", "k": 40}):
        before = state.fast_searches  # type: ignore[attr-defined]
        lean = client.post("/search", headers=ADMIN, json={"vectors_b64": _b64(q), **extra})
        assert state.fast_searches == before + 1  # type: ignore[attr-defined]
        route = client.post("/search", headers=ADMIN, json={"vectors": q.tolist(), **extra})  # JSON: the route
        assert state.fast_searches == before + 1  # type: ignore[attr-defined]
        assert lean.status_code == route.status_code == 200
        assert lean.content == route.content and lean.headers["content-type"] == route.headers["content-type"]
        assert lean.headers["x-request-id"] and lean.headers["content-length"] == str(len(lean.content))
    client.delete(f"/pool/{ids[5]}", headers=ADMIN)
    res = client.post("/search", headers=ADMIN, json={"vectors_b64": _b64(vecs[5:6]), "k": 40}).json()
    assert ids[5] not in res["results"][0]["ids"] and len(res["results"][0]["ids"]) == 39
    assert 'route="/search"' in client.get("/metrics").text


def test_everything_else_goes_to_the_route(app_client: tuple[TestClient, list[str], np.ndarray, object]) -> None:
    client, ids, vecs, state = app_client
    before = state.fast_searches  # type: ignore[attr-defined]
    q = _b64(vecs[:1])
    expect_error(client.post("/search", headers=ADMIN, json={"vectors_b64": "%%%"}), 422, "invalid_input")
    expect_error(client.post("/search", headers=ADMIN, json={"vectors_b64": q, "k": 0}), 422, "invalid_input")
    expect_error(client.post("/search", headers=ADMIN, json={"vectors_b64": q, "bogus": 1}), 422,
                 "invalid_request")
    expect_error(client.post("/search", headers=ADMIN, json={"vectors_b64": q, "identity": "other"}), 409,
                 "conflict")
    expect_error(client.post("/search", headers=ADMIN, json={"vectors_b64": _b64(vecs[:1, :4])}), 422,
                 "invalid_input")
    broken = client.post("/search", content=b"{not json", headers={**ADMIN, "content-type": "application/json"})
    assert broken.status_code in (400, 422) and "error" in broken.json()
    expect_error(client.post("/search", headers={"Authorization": "Bearer nope"}, json={"vectors_b64": q}), 401,
                 "unauthorized")
    lax = client.post("/search", headers=ADMIN, json={"vectors_b64": q, "k": "5"})  # the model's lax int: route
    assert lax.status_code == 200 and len(lax.json()["results"][0]["ids"]) == 5
    assert state.fast_searches == before  # type: ignore[attr-defined]


def test_the_lean_path_takes_its_bounds_from_the_request_model() -> None:
    from t3ar_services.retriever import fastpath, schemas

    assert fastpath._SEED == (0, schemas.MAX_SAFE_INTEGER) and fastpath._R == (1, 100)
    assert fastpath._MAX_EXCLUDE == 100_000
    body = b'{"vectors_b64": "AAAA", "seed": %d}'
    assert fastpath._parse(body % schemas.MAX_SAFE_INTEGER) is not None
    assert fastpath._parse(body % (schemas.MAX_SAFE_INTEGER + 1)) is None  # the route answers (422)
    assert fastpath._parse(b'{"vectors_b64": "AAAA", "k": true}') is None
    assert fastpath._parse(b'{"vectors_b64": "AAAA", "images_b64": ["x"]}') is None
    assert fastpath._parse(b'[1]') is None and fastpath._parse(b'\xff') is None


def _search_count(client: TestClient) -> float:
    m = re.search(r't3ar_retriever_request_seconds_count\{method="POST",route="/search",status="200"\} (\S+)',
                  client.get("/metrics").text)
    return float(m.group(1)) if m else 0.0


def test_the_fast_lane_keeps_auth_request_ids_metrics_and_the_access_log(
        app_client: tuple[TestClient, list[str], np.ndarray, object], caplog: pytest.LogCaptureFixture) -> None:
    client, ids, vecs, state = app_client
    body = {"vectors_b64": _b64(vecs[:1]), "k": 3}
    before, counted = state.fast_searches, _search_count(client)  # type: ignore[attr-defined]
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic rw-t"}):
        resp = client.post("/search", headers=headers, json=body)
        expect_error(resp, 401, "unauthorized")
        assert resp.headers["www-authenticate"] == "Bearer" and resp.headers["x-request-id"]
    with caplog.at_level(logging.INFO, logger="t3ar.access"):
        ok = client.post("/search", headers={"Authorization": "Bearer rw-t", "X-Request-ID": "abc-123"}, json=body)
    assert ok.status_code == 200 and ok.headers["x-request-id"] == "abc-123"
    assert any(r.getMessage().startswith("POST /search 200 ") for r in caplog.records)
    odd = client.post("/search", headers={"Authorization": "Bearer rw-t", "X-Request-ID": "bad id!"}, json=body)
    assert re.fullmatch(r"[0-9a-f]{32}", odd.headers["x-request-id"])  # an insane id is replaced
    assert state.fast_searches == before + 2  # type: ignore[attr-defined]
    route = client.post("/search", headers=ADMIN, json={**body, "k": "3"})  # handed down the stack: counted once
    assert route.status_code == 200 and route.headers["x-request-id"] and state.fast_searches == before + 2  # type: ignore[attr-defined]
    assert _search_count(client) == counted + 3


def test_the_fast_lane_leaves_the_body_limit_to_the_stack(tmp_path: Path) -> None:
    with vector_retriever(tmp_path / "pool", DIM, max_upload_bytes=100) as client:
        big = {"vectors_b64": _b64(np.ones((8, DIM))), "k": 1}  # 8 x 32 bytes of base64 and more: over 100
        expect_error(client.post("/search", headers=ADMIN, json=big), 413, "payload_too_large")
        small = client.post("/search", headers=ADMIN, json={"vectors_b64": _b64(np.ones((1, DIM)))})
        assert small.status_code == 200 and small.json()["results"] == [{"ids": [], "scores": []}]
        assert client.app.state.retriever.fast_searches == 1  # type: ignore[attr-defined]

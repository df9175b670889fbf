"""Issue 29's probe, in-process (FastAPI TestClient on a small vectors-only pool and on the API with fakeredis):
lone surrogates (F1), JSON that cannot be held (F4), duplicate Authorization headers (F8), the /search body
bound (F7) and scope checks before bodies (F9). Each answer is a 4xx with the error body and nothing changes."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from error_envelope import expect_error
from fastapi.testclient import TestClient
from retriever_kit import vector_retriever

ADMIN = {"Authorization": "Bearer admin-t"}
DIM = 8


@pytest.fixture()
def pool(tmp_path: Path) -> Iterator[tuple[TestClient, list[str]]]:
    with vector_retriever(tmp_path / "pool", DIM, max_queries=4) as client:
        vecs = np.random.default_rng(0).normal(size=(10, DIM)).astype("<f4")
        ids = client.post("/pool/vectors", headers=ADMIN, params={"identity": "synthetic"},
                          content=vecs.tobytes()).json()["ids"]
        yield client, ids


def _b64(x: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(x, dtype="<f4").tobytes()).decode()


def _raw(client: TestClient, path: str, doc: str, headers: dict[str, str] | None = None) -> Any:
    """POST a JSON text as written (json= would refuse a lone surrogate)."""
    return client.post(path, content=doc.encode(), headers={"Content-Type": "application/json",
                                                            **(headers or ADMIN)})


def test_f1_lone_surrogates_are_422_not_500(pool: tuple[TestClient, list[str]]) -> None:
    client, ids = pool
    unit = json.dumps([[1.0] + [0.0] * (DIM - 1)])
    b64 = json.dumps(_b64(np.eye(1, DIM)))
    for doc in (f'{{"vectors": {unit}, "source": "\\ud800"}}', f'{{"vectors_b64": {b64}, "source": "\\ud800"}}',
                f'{{"vectors_b64": {b64}, "identity": "\\udfff"}}',
                f'{{"vectors": {unit}, "exclude_ids": ["a\\ud800"]}}'):
        expect_error(_raw(client, "/search", doc), 422, "invalid_request", "surrogate")
    for doc in ('{"ids": ["\\ud800"]}', '{"ids": ["\\ud800"], "missing_ok": true}',
                f'{{"ids": ["{ids[0]}", "\\ud800"], "missing_ok": true}}'):
        expect_error(_raw(client, "/pool/delete", doc), 422, "invalid_request", "surrogate")
    assert client.get("/stats", headers=ADMIN).json()["count"] == 10  # nothing was deleted


def test_f8_duplicate_authorization_headers_are_refused_on_every_path(pool: tuple[TestClient, list[str]]) -> None:
    client, ids = pool
    body = {"vectors_b64": _b64(np.eye(1, DIM)), "k": 1}
    for pair in (("Bearer nope", "Bearer admin-t"), ("Bearer admin-t", "Bearer nope"),
                 ("Bearer admin-t", "Bearer admin-t")):
        headers = [("authorization", pair[0]), ("authorization", pair[1])]
        for method, path, kwargs in (("POST", "/search", {"json": body}),  # the fast lane
                                     ("POST", "/search", {"json": {**body, "k": "1"}}),  # the route
                                     ("GET", f"/pool/{ids[0]}", {}), ("GET", "/stats", {})):
            resp = client.request(method, path, headers=headers, **kwargs)  # type: ignore[arg-type]
            expect_error(resp, 400, "bad_request", "more than one Authorization header")
    assert client.request("POST", "/search", headers=ADMIN, json=body).status_code == 200


def test_f7_search_bodies_over_what_a_search_can_use_are_413_before_reading(
        pool: tuple[TestClient, list[str]]) -> None:
    client, _ = pool
    app = client.app
    limit = app.state.retriever.search_body_limit()  # type: ignore[attr-defined]
    # 4 queries x 8 numbers: far below the upload limit, yet the bound of a search of this pool
    assert 4 * DIM * 4 < limit < 8 * 1024 * 1024
    too_big = json.dumps({"vectors_b64": "A" * limit, "k": 1})
    resp = _raw(client, "/search", too_big)
    expect_error(resp, 413, "payload_too_large", "T3AR_RETRIEVER_MAX_QUERIES")
    ok = client.post("/search", headers=ADMIN, json={"vectors_b64": _b64(np.eye(4, DIM)), "k": 1})
    assert ok.status_code == 200, ok.text


def test_f4_json_that_cannot_be_held_is_refused() -> None:
    from t3ar.errors import InvalidInputError
    from t3ar_services.common.text import check_text, parse_json_object

    for raw in ('{"t": Infinity}', '{"t": -Infinity}', '{"t": NaN}', '{"t": 1e999}', "[" * 100_000 + "]" * 100_000,
                '{"k": ' + "9" * 5000 + "}", '{"a": "\\ud800"}', '{"\\udc00": 1}', "[1]", "{"):
        with pytest.raises(InvalidInputError):
            parse_json_object(raw, "config", '{"k": 5}')
    assert parse_json_object('{"a": [1, 2.5, "x", null]}', "config", "") == {"a": [1, 2.5, "x", None]}
    with pytest.raises(InvalidInputError, match=r"report\.x\[1\]"):
        check_text({"x": ["ok", "\ud800"]}, "report")
    with pytest.raises(InvalidInputError, match="finite"):
        check_text({"x": float("nan")}, "report")


def test_f2_a_stored_item_with_bad_text_is_still_readable(pool: tuple[TestClient, list[str]]) -> None:
    """A row written before the door checked (or by another writer) never turns reads into 500s."""
    client, ids = pool
    state = client.app.state.retriever  # type: ignore[attr-defined]
    [seq] = state.pool.store.insert_vectors(np.eye(1, DIM, dtype="<f4"), "s", {"a": "\ud800", "n": float("nan")})
    bad_id = state.pool.format_id(seq)
    item = client.get(f"/pool/{bad_id}", headers=ADMIN)
    assert item.status_code == 200, item.text
    assert item.json()["metadata"] == {"a": "\ufffd", "n": None}
    page = client.get("/pool", headers=ADMIN, params={"limit": 1000})
    assert page.status_code == 200 and bad_id in [i["id"] for i in page.json()["items"]]


def test_query_vectors_whose_scores_overflow_are_422(pool: tuple[TestClient, list[str]]) -> None:
    """Found by the OpenAPI fuzzing while fixing issue 29: JSON numbers beyond float32 (or NaN bytes in
    vectors_b64) gave a 200 whose scores were null."""
    client, _ = pool
    for body in ({"vectors": [[1e300] + [0.0] * (DIM - 1)]}, {"vectors": [[3e38] * DIM]}):
        expect_error(client.post("/search", headers=ADMIN, json={**body, "k": 2}), 422, "invalid_request",
                     "less than or equal to 100000000000000")
    for raw in ('{"vectors": [[NaN, 0, 0, 0, 0, 0, 0, 0]]}', '{"vectors": [[Infinity, 0, 0, 0, 0, 0, 0, 0]]}'):
        assert _raw(client, "/search", raw).status_code == 422
    for body in ({"vectors_b64": _b64(np.full((1, DIM), np.nan))}, {"vectors_b64": _b64(np.full((1, DIM), 3e38))}):
        expect_error(client.post("/search", headers=ADMIN, json={**body, "k": 2}), 422, "invalid_input", "finite")


def test_f9_the_retriever_refuses_a_token_without_the_routes_scope_before_the_body(
        pool: tuple[TestClient, list[str]]) -> None:
    client, _ = pool
    for path, kwargs in (("/pool/vectors?identity=synthetic", {"content": b"\0" * 64}),
                         ("/pool/delete", {"json": {"ids": ["x"]}})):
        resp = client.post(path, headers={"Authorization": "Bearer rw-t"}, **kwargs)  # type: ignore[arg-type]
        expect_error(resp, 403, "forbidden", "T3AR_RETRIEVER_ADMIN_TOKEN")
        assert resp.headers["connection"] == "close"  # answered by the early check, before the body was read

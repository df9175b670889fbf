"""Retriever routes in-process (FastAPI TestClient) on a small vectors-only pool: no embedder, no server
process. Bad ids and search options get their 4xx with the error body, never a 500."""

from __future__ import annotations

import random
import re
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from error_envelope import expect_error as _expect
from fastapi.testclient import TestClient

from t3ar_services.retriever.main import create_app
from t3ar_services.retriever.openapi import positive_int_regex
from t3ar_services.retriever.pool import MAX_SEQ
from t3ar_services.retriever.settings import RetrieverSettings

ADMIN = {"Authorization": "Bearer admin-t"}
DIM = 8


@pytest.fixture()
def pool(tmp_path: Path) -> Iterator[tuple[TestClient, list[str]]]:
    """A ready vectors-only pool holding 20 items; yields (client, their ids)."""
    settings = RetrieverSettings(data_dir=tmp_path / "pool", token="rw-t", admin_token="admin-t",  # type: ignore[arg-type]
                                 embedder="none", vector_dim=DIM, vector_identity="synthetic")
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        deadline = time.monotonic() + 30
        while client.get("/ready").status_code != 200:
            assert time.monotonic() < deadline, "the pool did not become ready"
            time.sleep(0.05)
        vecs = np.random.default_rng(0).normal(size=(20, DIM)).astype("<f4")
        resp = client.post("/pool/vectors", headers=ADMIN, params={"identity": "synthetic"}, content=vecs.tobytes())
        assert resp.status_code == 200, resp.text
        yield client, resp.json()["ids"]


def test_ids_beyond_64_bits_are_unknown(pool: tuple[TestClient, list[str]]) -> None:
    client, ids = pool
    tag = ids[0].split("-")[0]
    # 2^63 and up do not fit SQLite's or faiss's signed 64-bit ids; non-ASCII digits and 5000-digit numbers
    # are not ids either (int() refuses them)
    for bad in (f"{tag}-{2**63}", f"{tag}-{2**64 + 5}", f"{tag}-{'9' * 5000}", f"{tag}-\u00b2", f"{tag}-\u0661"):
        _expect(client.get(f"/pool/{bad}", headers=ADMIN), 404, "not_found")
        _expect(client.get(f"/pool/{bad}/image", headers=ADMIN), 404, "not_found")
        _expect(client.delete(f"/pool/{bad}", headers=ADMIN), 404, "not_found")
        _expect(client.post("/pool/delete", headers=ADMIN, json={"ids": [bad]}), 404, "not_found")
        _expect(client.get("/pool", headers=ADMIN, params={"after": bad}), 422, "invalid_input", "after")
        resp = client.post("/pool/delete", headers=ADMIN, json={"ids": [bad, ids[0]], "missing_ok": True})
        assert resp.status_code == 200 and resp.json()["not_found"] == [bad], resp.text
        unit = [1.0] + [0.0] * (DIM - 1)
        resp = client.post("/search", headers=ADMIN, json={"vectors": [unit], "k": 3, "exclude_ids": [bad]})
        assert resp.status_code == 200 and len(resp.json()["results"][0]["ids"]) == 3, resp.text
        ids = ids[1:]
    # the largest id that fits is a well-formed id: simply not in the pool
    _expect(client.get(f"/pool/{tag}-{2**63 - 1}", headers=ADMIN), 404, "not_found")
    assert client.get("/pool", headers=ADMIN, params={"after": f"{tag}-{2**63 - 1}"}).json()["items"] == []
    assert client.get("/stats", headers=ADMIN).json()["count"] == 15


def test_search_seed_must_be_non_negative(pool: tuple[TestClient, list[str]]) -> None:
    client, _ = pool
    body = {"vectors": [[1.0] + [0.0] * (DIM - 1)], "k": 3, "r": 3}
    for seed in (-1, -(2**70), 2**53, 2**64 - 1, 2**64):  # 2^53 - 1: the largest integer exact in every JSON parser
        _expect(client.post("/search", headers=ADMIN, json={**body, "seed": seed}), 422, "invalid_request", "seed")
    first = client.post("/search", headers=ADMIN, json={**body, "seed": 2**53 - 1})
    assert first.status_code == 200, first.text
    assert client.post("/search", headers=ADMIN, json={**body, "seed": 2**53 - 1}).json() == first.json()
    assert client.post("/search", headers=ADMIN, json={**body, "seed": 0}).status_code == 200


def test_positive_int_regex_is_exact() -> None:
    rng = random.Random(0)
    for limit in (1, 7, 10, 15, 100, 907, 120034, MAX_SEQ):
        pattern = re.compile(positive_int_regex(limit) + r"\Z")
        probes = [*range(1200), limit - 1, limit, limit + 1, 10 * limit,
                  *(rng.randint(1, 3 * limit) for _ in range(500))]
        for n in probes:
            assert bool(pattern.match(str(n))) == (1 <= n <= limit), (limit, n)
        assert not pattern.match("01") and not pattern.match("")


def test_openapi_states_this_pools_ids_and_dimension(pool: tuple[TestClient, list[str]]) -> None:
    """The published document carries the open pool's facts: `after` is an id of this pool, query vectors have its
    dimension, k its limit. What it accepts the server accepts, and the other way round."""
    client, ids = pool
    doc = client.get("/openapi.json").json()
    after = next(p for p in doc["paths"]["/pool"]["get"]["parameters"] if p["name"] == "after")
    published = next(o for o in after["schema"]["anyOf"] if o.get("type") == "string")["pattern"]
    assert published.endswith("$")
    pattern = re.compile(published[:-1] + r"\Z")  # JSON Schema's (ECMA's) $ is Python's \Z: no final newline
    tag = ids[0].split("-")[0]
    for good in (ids[0], ids[-1], f"{tag}-{MAX_SEQ}"):
        assert pattern.match(good) and client.get("/pool", headers=ADMIN, params={"after": good}).status_code == 200
    for bad in (f"{tag}-0", f"{tag}-{MAX_SEQ + 1}", f"{tag}-01", f"x{tag}-1", f"{tag}-1\n"):
        assert not pattern.match(bad)
        _expect(client.get("/pool", headers=ADMIN, params={"after": bad}), 422, "invalid_input", "after")
    search = doc["components"]["schemas"]["SearchRequest"]
    rows = next(o for o in search["properties"]["vectors"]["anyOf"] if o.get("type") == "array")
    assert rows["items"]["minItems"] == rows["items"]["maxItems"] == DIM
    assert search["properties"]["k"]["maximum"] == 1000 and len(search["oneOf"]) == 3
    source = next(p for p in doc["paths"]["/pool/vectors"]["post"]["parameters"] if p["name"] == "source")["schema"]
    assert source["maxLength"] == 200 and not re.match(source["pattern"][:-1] + r"\Z", "a\x04")
    vec = np.ones((1, DIM), "<f4").tobytes()
    _expect(client.post("/pool/vectors", headers=ADMIN, params={"identity": "synthetic", "source": "a\x04"},
                        content=vec), 422, "invalid_input", "source")
    two_kinds = {"vectors": [[1.0] * DIM], "vectors_b64": "AAAA", "k": 1}
    _expect(client.post("/search", headers=ADMIN, json=two_kinds), 422, "invalid_request", "exactly one")


def test_a_bad_label_is_refused_on_every_door_and_nothing_is_stored(pool: tuple[TestClient, list[str]]) -> None:
    """Issue 33: the label of POST /pool/vectors is checked (POST /pool's: tests/integration/
    test_retriever_bad_input.py); a refused request stores nothing; listings filter by label."""
    client, ids = pool
    vec = np.ones((1, DIM), dtype="<f4").tobytes()
    for label in ("a\nb", " x", "y" * 201):
        resp = client.post("/pool/vectors", headers=ADMIN, params={"identity": "synthetic", "label": label},
                           content=vec)
        _expect(resp, 422, "invalid_input", "label")
    assert client.get("/pool", headers=ADMIN).json()["total"] == len(ids)
    resp = client.post("/pool/vectors", headers=ADMIN, params={"identity": "synthetic", "label": "dog"}, content=vec)
    assert resp.status_code == 200, resp.text
    [new] = resp.json()["ids"]
    listed = client.get("/pool", headers=ADMIN, params={"label": "dog"}).json()
    assert [it["id"] for it in listed["items"]] == [new] and listed["total"] == 1
    assert client.get(f"/pool/{new}", headers=ADMIN).json()["label"] == "dog"
    assert client.get(f"/pool/{ids[0]}", headers=ADMIN).json()["label"] is None

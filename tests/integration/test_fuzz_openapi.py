"""Property-based fuzzing of both services from their own OpenAPI documents (schemathesis), in-process.

Each app is built as in tests/unit/test_{retriever,api}_routes.py (a ready vectors-only retriever pool; the API
with fakeredis and a mocked retriever) and schemathesis runs all its phases (explicit examples, coverage of
boundaries and unsupported methods, random fuzzing, stateful sequences) with every check: no 5xx, status
codes, content types, headers and bodies as documented, 405 with the right ``Allow``, schema-invalid requests
refused, schema-valid requests accepted. Authenticated with the admin token (every route is reachable) and with
the user token (admin routes must answer their documented 403), and for the API with the worker token (the
/internal routes reached; every other route must answer its documented 403). Bounded (max examples per
operation) and seeded, so a CI run is reproducible: about two and a half minutes for all five runs on a 2-core
machine.
"""

from __future__ import annotations

import base64
import io
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import fakeredis
import httpx
import numpy as np
import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import strategies as st
from PIL import Image
from retriever_answers import stats_json
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import events, from_schema
from schemathesis.python.asgi import shutdown_lifespans

from t3ar.clients.retriever import RetrieverClient
from t3ar.models.backbones import BackboneSpec
from t3ar.models.checkpoint import save_checkpoint
from t3ar.models.classifier import ModelSpec, build_classifier
from t3ar_services.api.main import create_app as create_api
from t3ar_services.api.routes.models import CHECKPOINT_MEDIA_TYPE
from t3ar_services.api.settings import ApiSettings
from t3ar_services.retriever.main import create_app as create_retriever
from t3ar_services.retriever.openapi import F32_ROWS_B64, IMAGE_B64
from t3ar_services.retriever.settings import RetrieverSettings

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::ResourceWarning")

SEED = 11
DIM = 8  # the fuzzed retriever's pool


def _f32_rows(max_rows: int) -> st.SearchStrategy[bytes]:
    """float32 little-endian rows of DIM finite numbers, not all zero (what the retriever documents)."""
    row = st.lists(st.floats(-1e3, 1e3, allow_nan=False, width=32), min_size=DIM, max_size=DIM).filter(any)
    return st.lists(row, min_size=1, max_size=max_rows).map(lambda rows: np.asarray(rows, "<f4").tobytes())


def _png_b64(seed: int) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (seed % 256, 7, 9)).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


# The formats the retriever's document names for what JSON Schema cannot state (services/retriever/openapi.py).
schemathesis.openapi.format(F32_ROWS_B64, _f32_rows(4).map(lambda raw: base64.b64encode(raw).decode()))
schemathesis.openapi.format(IMAGE_B64, st.integers(0, 255).map(_png_b64))
schemathesis.openapi.media_type("application/octet-stream", _f32_rows(16))

# Schemathesis' negative phase "mutates" a multipart text field's type (e.g. name -> 123 or {}), but multipart
# carries every field as text, so the server rightly receives a valid string ("123"). Not failures.
_MULTIPART_TEXT_RETYPED = re.compile(r"violates `type` at /properties/\w+ \(was string, became \w+\)")

# The one operation exempt from positive_data_acceptance: POST /adapt. Its document names what JSON Schema cannot
# state (the archive's media types, the `config` format); with generators for both registered here, schemathesis
# 4.32 sent a "positive" case whose required model_id was "" and, in its stateful phase, reported a valid request
# (a model it had uploaded, a good archive: 202) as a negative one ("Invalid component: positive test case").
# Its negative checks and every other check still run on it.
POSITIVE_ACCEPTANCE_SKIPPED = {"api": [("POST", "/adapt")], "retriever": []}


def fuzz(app: FastAPI, token: str, *, max_examples: int, skip_positive: list[tuple[str, str]],
         prepare: Callable[[TestClient], None] = lambda client: None) -> list[str]:
    """Run schemathesis against ``app``'s /openapi.json; the failures, one line each (operation, check, request).
    Schemathesis runs the app's lifespan (started on loading the schema); ``prepare`` then fills the app."""
    config = SchemathesisConfig.from_dict({
        "seed": SEED,
        "headers": {"Authorization": f"Bearer {token}"},
        "generation": {"max-examples": max_examples, "database": "none"},
        "checks": {"enabled": True},
        "operations": [{"include-method": m, "include-path": p, "checks": {"positive_data_acceptance": {
            "enabled": False}}} for m, p in skip_positive],
    })
    try:
        schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=config)
        prepare(TestClient(app))  # no `with`: the lifespan is schemathesis's
        return _failures(from_schema(schema).execute())
    finally:
        shutdown_lifespans()


def _failures(stream: Iterable[events.EngineEvent]) -> list[str]:
    failures: dict[tuple[str, str, str], str] = {}
    cases = 0
    for event in stream:
        if isinstance(event, events.ScenarioFinished):
            cases += len(event.recorder.cases)
            for case_id, checks in event.recorder.checks.items():
                for check in checks:
                    if check.failure_info is None:
                        continue
                    failure = check.failure_info.failure
                    sent = event.recorder.interactions.get(case_id)
                    if check.name == "negative_data_rejection" and sent is not None and (sent.request.body or b"")[
                            :2] == b"--" and _MULTIPART_TEXT_RETYPED.search(str(failure.message)):
                        continue  # a multipart body (it starts with its boundary)
                    status = sent.response.status_code if sent and sent.response else "?"
                    request = f"{sent.request.method} {sent.request.uri} -> {status}" if sent else "?"
                    failures.setdefault((event.recorder.label, check.name, failure.title),
                                        f"{event.recorder.label}: {check.name}: {failure.title} ({request}): "
                                        f"{str(failure.message)[:300]}")
        elif isinstance(event, (events.NonFatalError, events.FatalError)):
            failures[("error", str(event.id), "")] = f"schemathesis error: {getattr(event, 'value', event)}"
    assert cases > 100, f"only {cases} cases ran"
    return list(failures.values())


@pytest.fixture()
def retriever(tmp_path: Path) -> FastAPI:
    settings = RetrieverSettings(data_dir=tmp_path / "pool", token="rw-t", admin_token="admin-t",  # type: ignore[arg-type]
                                 embedder="none", vector_dim=DIM, vector_identity="synthetic")
    return create_retriever(settings)


def _fill_pool(client: TestClient) -> None:
    """Wait for the index, then add 20 vectors (ids for the stateful phase to find)."""
    deadline = time.monotonic() + 30
    while client.get("/ready").status_code != 200:
        assert time.monotonic() < deadline, "the pool did not become ready"
        time.sleep(0.05)
    vecs = np.random.default_rng(0).normal(size=(20, DIM)).astype("<f4")
    resp = client.post("/pool/vectors", headers={"Authorization": "Bearer admin-t"}, params={"identity": "synthetic"},
                       content=vecs.tobytes())
    assert resp.status_code == 200, resp.text


def _mock_retriever(req: httpx.Request) -> httpx.Response:
    if req.url.path == "/stats":
        return httpx.Response(200, json=stats_json(50))
    if req.url.path == "/ready":
        return httpx.Response(200, json={"ready": True})
    return httpx.Response(404, json={"error": {"code": "not_found", "message": "no such item"}})


@pytest.fixture(scope="module")
def checkpoint_uploads(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The part POST /models documents as CHECKPOINT_MEDIA_TYPE: a real (tiny) t3ar checkpoint."""
    spec = ModelSpec(backbone=BackboneSpec(name="mobilenetv2_050", weights="none"), classes=("a", "b"), image_size=32)
    path = tmp_path_factory.mktemp("ckpt") / "m.pt"
    save_checkpoint(path, build_classifier(spec), spec)
    schemathesis.openapi.media_type(CHECKPOINT_MEDIA_TYPE, st.just(path.read_bytes()))


@pytest.fixture()
def api(tmp_path: Path, checkpoint_uploads: None) -> FastAPI:
    settings = ApiSettings(data_dir=tmp_path / "data",  # type: ignore[arg-type]
                           token="user-t", admin_token="admin-t", worker_token="worker-t",
                           retriever_admin_token="r-admin", validate_threads=0, max_upload_bytes=200_000,
                           sweep_interval=3600, auth_failures=1_000_000)  # its auth checks send many wrong tokens
    app = create_api(settings, redis=fakeredis.FakeRedis())
    state: Any = app.state.api
    state.retriever = RetrieverClient("http://r", "r-rw", transport=httpx.MockTransport(_mock_retriever), retries=0)
    state.retriever_admin = RetrieverClient("http://r", "r-admin", transport=httpx.MockTransport(_mock_retriever),
                                            retries=0)
    return app


@pytest.mark.parametrize(("token", "examples"), [("admin-t", 40), ("rw-t", 15)])
def test_retriever_conforms_to_its_openapi(retriever: FastAPI, token: str, examples: int) -> None:
    failures = fuzz(retriever, token, max_examples=examples, skip_positive=POSITIVE_ACCEPTANCE_SKIPPED["retriever"],
                    prepare=_fill_pool)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize(("token", "examples"), [("admin-t", 40), ("user-t", 15), ("worker-t", 15)])
def test_api_conforms_to_its_openapi(api: FastAPI, token: str, examples: int) -> None:
    failures = fuzz(api, token, max_examples=examples, skip_positive=POSITIVE_ACCEPTANCE_SKIPPED["api"])
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("service", ["retriever", "api"])
def test_405_allows_every_documented_method(service: str, request: pytest.FixtureRequest) -> None:
    """Starlette's 405 listed only the first matching route's methods (OPTIONS /pool: ``Allow: POST``; PUT
    /pool/delete: ``Allow: GET``, the methods of /pool/{item_id})."""
    app: FastAPI = request.getfixturevalue(service)
    paths = app.openapi()["paths"]
    with TestClient(app) as client:
        for path, template in (("/pool", "/pool"), ("/pool/delete", "/pool/delete"), ("/pool/x-1", "/pool/{item_id}"),
                               ("/models", "/models"), ("/jobs/abc/cancel", "/jobs/{job_id}/cancel")):
            if template not in paths:
                continue
            for method in ("OPTIONS", "PUT", "PATCH", "TRACE"):
                resp = client.request(method, path, headers={"Authorization": "Bearer admin-t"})
                assert resp.status_code == 405, (method, path, resp.text)
                assert resp.headers["allow"] == ", ".join(sorted(m.upper() for m in paths[template])), (method, path)
                assert resp.json()["error"]["code"] == "method_not_allowed"

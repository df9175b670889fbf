"""Issue 29's probe against the API in-process (TestClient, fakeredis, a mocked retriever; the fixture and helpers
of test_api_routes / test_api_worker_routes): configs that cannot be held (F4), scope before body (F9)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from error_envelope import expect_error
from test_api_routes import USER, _adapt, _archive, _model
from test_api_worker_routes import WORKER, env  # noqa: F401 - the fixture

from t3ar_services.api.main import create_app
from t3ar_services.api.settings import ApiSettings


def test_f4_adapt_configs_that_cannot_be_held_are_422(env: Any, tmp_path: Path) -> None:  # noqa: F811
    client, redis, data = env
    model_id = _model(client, tmp_path)
    for config in ('{"temperature": Infinity}', '{"weight_decay": Infinity}', '{"lr": NaN}', '{"lr": 1e999}',
                   '{"k": ' + "9" * 5000 + "}", '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}",
                   '{"method": "\\ud800"}'):
        resp = client.post("/adapt", files={"archive": ("t.zip", _archive())},
                           data={"model_id": model_id, "config": config}, headers=USER)
        expect_error(resp, 422, "invalid_input", "config")
    assert not list((data / "jobs").iterdir())  # nothing was kept
    assert _adapt(client, model_id, _archive(), {"method": "tent", "epochs": 1}).status_code == 202


def _first_receive(app: Any, method: str, path: str, token: str) -> tuple[int, int]:
    """Send one request with a 900 MB declared body straight to the ASGI app; (status, body reads)."""
    reads = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        return {"type": "http.request", "body": b"x" * 65536, "more_body": True}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "scheme": "http", "server": ("t", 80), "client": ("c", 1), "http_version": "1.1",
             "headers": [(b"authorization", f"Bearer {token}".encode()), (b"content-length", b"900000000"),
                         (b"content-type", b"multipart/form-data; boundary=x")]}
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 10))
    return sent[0]["status"], reads


def test_f9_scope_is_checked_before_the_body_is_read(tmp_path: Path) -> None:
    settings = ApiSettings(data_dir=tmp_path / "d", token="user-t", admin_token="admin-t",  # type: ignore[arg-type]
                           worker_token="worker-t", max_upload_bytes=2_000_000_000, max_model_bytes=10)
    app = create_app(settings)
    for method, path, token in (("POST", "/adapt", "worker-t"), ("POST", "/models", "worker-t"),
                                ("PUT", f"/internal/jobs/{'a' * 32}/checkpoint", "user-t"),
                                ("PUT", f"/internal/jobs/{'a' * 32}/result", "admin-t")):
        status, reads = _first_receive(app, method, path, token)
        assert (status, reads) == (403, 0), (method, path, token)
    status, reads = _first_receive(app, "POST", "/adapt", "nope")
    assert (status, reads) == (401, 0)


def test_f9_the_403_names_the_scope(env: Any) -> None:  # noqa: F811
    client, _, _ = env
    resp = client.post("/adapt", headers=WORKER, files={"archive": ("t.zip", b"x")}, data={"model_id": "m"})
    expect_error(resp, 403, "forbidden", "worker token opens only the worker routes")
    resp = client.put(f"/internal/jobs/{'a' * 32}/result", headers=USER, content=json.dumps({}))
    expect_error(resp, 403, "forbidden", "T3AR_API_WORKER_TOKEN")

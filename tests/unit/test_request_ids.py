"""Issue 11, observability: a JSON log format option; a request id accepted or made at the API, returned,
in every log line, sent on to the retriever and handed to the worker in the job; an access log."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import httpx
import pytest
from fastapi.testclient import TestClient

from t3ar.clients.retriever import RetrieverClient
from t3ar.logs import REQUEST_ID, JsonFormatter, RequestIdFilter, configure_logging, log_format, request_id_from
from t3ar_services.api.main import create_app
from t3ar_services.api.settings import ApiSettings
from t3ar_services.common.job_contract import JobSpec


@pytest.fixture()
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_request_ids_are_accepted_when_sane_else_made() -> None:
    assert request_id_from("abc-123_x.y:z") == "abc-123_x.y:z"
    for bad in (None, "", "a b", "x" * 129, "é", "a\nb"):
        made = request_id_from(bad)
        assert made != bad and len(made) == 32 and int(made, 16) >= 0


def test_json_lines_carry_the_request_id(restore_logging: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("T3AR_LOG_FORMAT", "json")
    configure_logging("INFO")
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler.formatter, JsonFormatter)
    out = io.StringIO()
    handler.setStream(out)  # type: ignore[attr-defined]
    token = REQUEST_ID.set("req-7")
    try:
        logging.getLogger("t3ar.test").info("hello %s", "world")
    finally:
        REQUEST_ID.reset(token)
    logging.getLogger("t3ar.test").warning("outside")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["message"] == "hello world" and first["request_id"] == "req-7" and first["level"] == "INFO"
    assert first["logger"] == "t3ar.test" and first["ts"].endswith("Z")
    assert second["request_id"] == "-"
    monkeypatch.setenv("T3AR_LOG_FORMAT", "xml")
    with pytest.raises(ValueError, match="T3AR_LOG_FORMAT"):
        log_format()


def test_text_lines_carry_the_request_id() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
    token = REQUEST_ID.set("r-1")
    try:
        RequestIdFilter().filter(record)
    finally:
        REQUEST_ID.reset(token)
    assert record.request_id == "r-1"  # type: ignore[attr-defined]


def test_api_accepts_returns_logs_and_forwards_the_id(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    seen: list[httpx.Request] = []

    def retriever(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return httpx.Response(200, json={"deleted": [req.url.path.rsplit("/", 1)[-1]], "not_found": []})

    settings = ApiSettings(data_dir=tmp_path / "data", token="user-t", admin_token="admin-t",  # type: ignore[arg-type]
                           retriever_admin_token="r-admin", sweep_interval=3600)
    app = create_app(settings, redis=fakeredis.FakeRedis())
    app.state.api.retriever_admin = RetrieverClient("http://r", "r-admin", transport=httpx.MockTransport(retriever),
                                                    retries=0)
    caplog.set_level(logging.INFO, logger="t3ar.access")
    caplog.handler.addFilter(RequestIdFilter())
    with TestClient(app) as client:
        resp = client.delete("/pool/p-1", headers={"Authorization": "Bearer admin-t", "X-Request-ID": "trace-42"})
        made = client.get("/health")
        bad = client.get("/health", headers={"X-Request-ID": "no spaces allowed"})
    assert resp.headers["x-request-id"] == "trace-42"
    assert seen and all(r.headers["x-request-id"] == "trace-42" for r in seen)  # on to the retriever
    assert len(made.headers["x-request-id"]) == 32 and bad.headers["x-request-id"] != "no spaces allowed"
    lines = [r for r in caplog.records if r.name == "t3ar.access"]
    delete = [r for r in lines if r.getMessage().startswith("DELETE /pool/p-1 200 ")]
    assert len(delete) == 1 and delete[0].request_id == "trace-42"  # type: ignore[attr-defined]


def test_the_job_carries_the_request_id(tmp_path: Path) -> None:
    spec: dict[str, Any] = {"job_id": "j1", "model_id": "m", "model_sha256": "a" * 64, "target_sha256": "b" * 64,
                            "target_bytes": 10, "config": {}, "request_id": "trace-42", "job_secret": "s" * 32,
                            "subsample_rows": [0, 1], "subsample_sha256": "c" * 64}
    assert JobSpec.model_validate(spec).request_id == "trace-42"
    assert JobSpec.model_validate({k: v for k, v in spec.items() if k != "request_id"}).request_id is None

"""Issue 11, finding 5: a request with a body and no known token is answered 401 before its body is read."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import fakeredis
from asgi_probe import AsgiProbe
from fastapi.testclient import TestClient
from pydantic import SecretStr

from t3ar_services.api.main import create_app
from t3ar_services.api.settings import ApiSettings
from t3ar_services.common.credentials import CredentialsFirstMiddleware, token_matches


def _run(mw: CredentialsFirstMiddleware, method: str,
         headers: dict[str, str]) -> tuple[list[dict[str, Any]], int, bool]:
    """Call the middleware once; return what it sent, how often the body was read, whether the app ran."""
    probe = AsgiProbe(b"x" * 1000)
    reached = False

    async def app(scope: Any, rcv: Any, snd: Any) -> None:
        nonlocal reached
        reached = True
        await rcv()
        await snd({"type": "http.response.start", "status": 200, "headers": []})
        await snd({"type": "http.response.body", "body": b"ok"})

    mw.app = app
    scope = {"type": "http", "method": method, "path": "/adapt",
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    asyncio.run(mw(scope, probe.receive, probe.send))  # type: ignore[arg-type]
    return probe.sent, probe.reads, reached


def test_middleware_refuses_before_reading_and_passes_known_tokens() -> None:
    mw = CredentialsFirstMiddleware(None, accepts=lambda t: t == "good", enabled=True)  # type: ignore[arg-type]
    for headers in ({}, {"Authorization": "Bearer bad"}, {"Authorization": "Basic good"}, {"Authorization": "Bearer "}):
        sent, reads, reached = _run(mw, "POST", {"Content-Length": "1000", **headers})
        assert sent[0]["status"] == 401 and (b"www-authenticate", b"Bearer") in sent[0]["headers"], headers
        assert reads == 0 and not reached, headers  # not one byte of the body was read
    sent, reads, reached = _run(mw, "POST", {"Content-Length": "1000", "Authorization": "Bearer good"})
    assert sent[0]["status"] == 200 and reached and reads == 1
    sent, _, reached = _run(mw, "GET", {})  # no body: the route's own dependency decides (it may be open)
    assert reached
    off = CredentialsFirstMiddleware(None, accepts=lambda t: False, enabled=False)  # type: ignore[arg-type]
    assert _run(off, "POST", {"Content-Length": "1000"})[2]


def test_token_matches() -> None:
    assert token_matches("a", [None, SecretStr("b"), SecretStr("a")])
    assert not token_matches("a", [None, SecretStr("ab")]) and not token_matches("", [SecretStr("x")])


def test_api_answers_401_before_413_or_422(tmp_path: Path) -> None:
    """Before: an over-large upload without a token was 413 (or read in full), malformed JSON 422."""
    settings = ApiSettings(data_dir=tmp_path / "data", token="user-t", admin_token="admin-t",  # type: ignore[arg-type]
                           max_upload_bytes=200_000, max_model_bytes=100_000, sweep_interval=3600)
    with TestClient(create_app(settings, redis=fakeredis.FakeRedis())) as client:
        big = b"x" * (settings.max_body_bytes + 1)
        for headers in ({}, {"Authorization": "Bearer nope"}):
            for path, content, ctype in (("/adapt", big, "multipart/form-data; boundary=x"),
                                         ("/models", big, "multipart/form-data; boundary=x"),
                                         ("/jobs/x/readapt", b"{not json", "application/json")):
                resp = client.post(path, content=content, headers={"Content-Type": ctype, **headers})
                assert resp.status_code == 401, (path, headers, resp.status_code, resp.text)
                assert resp.json()["error"]["code"] == "unauthorized"
        # with a token the same requests get their real answers
        resp = client.post("/adapt", content=big, headers={"Authorization": "Bearer user-t"})
        assert resp.status_code == 413
        assert client.get("/health").status_code == 200


def test_retriever_answers_401_before_reading_an_upload(tmp_path: Path) -> None:
    from t3ar_services.retriever.main import create_app as create_retriever
    from t3ar_services.retriever.settings import RetrieverSettings

    settings = RetrieverSettings(data_dir=tmp_path / "pool", token="rw-t", admin_token="admin-t",  # type: ignore[arg-type]
                                 embedder="none", vector_dim=8, vector_identity="synthetic", max_upload_bytes=10_000)
    with TestClient(create_retriever(settings), raise_server_exceptions=False) as client:
        for path in ("/pool", "/search", "/pool/vectors"):
            resp = client.post(path, content=b"x" * 20_000, headers={"Content-Type": "application/json"})
            assert resp.status_code == 401 and resp.json()["error"]["code"] == "unauthorized", (path, resp.text)
        resp = client.post("/search", content=b"{bad", headers={"Content-Type": "application/json",
                                                                "Authorization": "Bearer rw-t"})
        assert resp.status_code == 422  # with a token, the body is read and judged

"""Every console error is the console's HTML error page with its security headers (issue 34, G2): path input
that the filesystem refuses (an embedded NUL, an overlong name), wrong-typed query parameters, unknown methods,
bodies over the limit and anything unexpected; the app never raises to the server (which would drop the
keep-alive connection)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asgi_kit import call
from console_kit import client as client  # the fixtures
from console_kit import finished_job, settings_for, signed_in
from console_kit import pool as pool
from fastapi.testclient import TestClient

from t3ar_services.api.console import web


def _is_error_page(resp: Any, status: int) -> None:
    assert resp.status_code == status, (resp.status_code, resp.text[:300])
    assert resp.headers["content-type"].startswith("text/html"), resp.headers
    assert "default-src 'none'" in resp.headers["content-security-policy"] and resp.headers["x-frame-options"] == "DENY"
    assert resp.headers["x-content-type-options"] == "nosniff" and 'id="error-message"' in resp.text, resp.text[:300]


def test_paths_the_filesystem_refuses_are_a_4xx_page(client: TestClient, tmp_path: Path) -> None:
    csrf = signed_in(client, "user-t")
    job_id = finished_job(client, tmp_path, csrf)
    assert client.get(f"/ui/jobs/{job_id}/target/imgs/a0.png").headers["content-type"] == "image/png"
    for name in ("imgs/a0.png%00.png", "imgs%00", "a" * 300, "imgs/" + "b" * 5000, "/".join(["c" * 250] * 20)):
        _is_error_page(client.get(f"/ui/jobs/{job_id}/target/{name}"), 404)
    _is_error_page(client.get(f"/ui/jobs/{'j' * 300}/target/x.png"), 404)
    _is_error_page(client.get("/ui/jobs/%00"), 404)
    for name in ("%00", "a%00.css", "a" * 300, "/".join(["b" * 250] * 20)):  # the console's static files
        _is_error_page(client.get(f"/ui/static/{name}"), 404)


def test_framework_errors_are_the_console_page(client: TestClient) -> None:
    signed_in(client, "user-t")
    _is_error_page(client.get("/ui/pool", params={"exact": "maybe"}), 422)  # a wrong-typed query parameter
    _is_error_page(client.put("/ui/jobs"), 405)
    _is_error_page(client.get("/ui/no-such-page"), 404)
    _is_error_page(client.post("/ui/logout", content=b"x" * (1 << 20),
                               headers={"content-type": "application/x-www-form-urlencoded"}), 413)


def test_an_unexpected_error_is_a_500_page_not_a_dropped_connection(client: TestClient, monkeypatch: Any) -> None:
    signed_in(client, "user-t")
    cookie = "; ".join(f"{k}={v}" for k, v in client.cookies.items())
    monkeypatch.setattr(web, "TEMPLATES", _Broken(web.TEMPLATES, "jobs.html", _boom))
    answer = call(client.app, "GET", "/ui/jobs", [("cookie", cookie)])  # raises if the app lets the error out
    assert answer.status == 500 and answer.headers["content-type"].startswith("text/html"), answer
    assert "default-src 'none'" in answer.headers["content-security-policy"] and b"a bug" not in answer.body


class _Broken:
    """TEMPLATES, with one template that raises when rendered (the cached template itself is left alone)."""

    def __init__(self, env: Any, name: str, fail: Any) -> None:
        self.env, self.name, self.fail = env, name, fail

    def get_template(self, name: str) -> Any:
        if name == self.name:
            return type("Failing", (), {"render": staticmethod(self.fail)})()
        return self.env.get_template(name)


def test_the_keep_alive_connection_survives_console_errors(tmp_path: Path, pool: dict[str, Any],
                                                           monkeypatch: Any) -> None:
    """Over real HTTP (uvicorn, the services' protocol): a wrong-typed parameter's page, an unexpected error's,
    then a good request, all on one connection."""
    import http.client

    from console_kit import app_for
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    from uvicorn_kit import serving

    app = app_for(settings_for(tmp_path), pool)
    cookie = f"t3ar_session={app.state.console_sessions.issue('user-t')}"
    with serving(app, http=HttpToolsProtocol) as port:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        conn.request("GET", "/ui/pool?exact=maybe", headers={"Cookie": cookie})
        first = conn.getresponse()
        assert first.status == 422 and "text/html" in first.getheader("content-type", ""), first.read()[:200]
        first.read()
        monkeypatch.setattr(web, "TEMPLATES", _Broken(web.TEMPLATES, "jobs.html", _boom))
        conn.request("GET", "/ui/jobs", headers={"Cookie": cookie})
        second = conn.getresponse()
        assert second.status == 500 and second.getheader("content-security-policy"), second.read()[:200]
        second.read()
        sock = conn.sock
        conn.request("GET", "/health")  # the same socket: the server kept the connection
        third = conn.getresponse()
        assert third.status == 200 and conn.sock is sock
        third.read()
        conn.close()


def _boom(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("a bug")


def test_a_hung_retriever_is_reported_at_once_and_named(tmp_path: Path) -> None:
    """Issue 34: a console page gives up on a retriever that accepts connections but never answers after
    T3AR_API_CONSOLE_TIMEOUT, with one attempt (the JSON API's client retries), and says which service is down."""
    import socket

    import fakeredis

    from t3ar_services.api.main import create_app

    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(16)  # the kernel accepts connections; nobody ever reads or answers
    url = f"http://127.0.0.1:{hung.getsockname()[1]}"
    app = create_app(settings_for(tmp_path, retriever_url=url, retriever_timeout=3, console_timeout=0.3),
                     redis=fakeredis.FakeRedis())
    try:
        with TestClient(app) as c:
            signed_in(c)
            page = c.get("/ui/pool")
            assert page.status_code == 503 and "retriever" in page.text and "ReadTimeout" in page.text, page.text
            assert "content-security-policy" in page.headers
            hung.setblocking(False)
            accepted = 0
            while True:
                try:
                    hung.accept()[0].close()
                    accepted += 1
                except BlockingIOError:
                    break
            assert accepted == 1  # one attempt, no retry
    finally:
        hung.close()


def test_a_failed_model_upload_says_what_is_wrong_with_the_file(client: TestClient, tmp_path: Path) -> None:
    """A checkpoint without its spec read "malformed checkpoint metadata: 'spec'" (a KeyError's text), one with a
    spec missing a field a page of pydantic output with links; now one line naming the entry or field."""
    import html
    import io

    import torch
    from console_kit import model_file

    csrf = signed_in(client, "user-t")
    good = torch.load(io.BytesIO(model_file(tmp_path)), weights_only=False)
    no_classes = {k: v for k, v in good["spec"].items() if k != "classes"}
    cases = {"has no 'spec' entry (the model's backbone, classes and image size)":
             {k: v for k, v in good.items() if k != "spec"},
             "its spec is invalid: classes: Field required": {**good, "spec": no_classes}}
    for expected, payload in cases.items():
        buf = io.BytesIO()
        torch.save(payload, buf)
        page = client.post("/ui/models", files={"file": ("mine.pt", buf.getvalue())},
                           data={"name": "x", "csrf": csrf})
        assert page.status_code == 422 and expected in html.unescape(page.text), page.text[-2000:]
        assert "pydantic.dev" not in page.text and "metadata: &#39;" not in page.text
        api = client.post("/models", files={"file": ("mine.pt", buf.getvalue())},
                          headers={"Authorization": "Bearer user-t"})
        assert api.status_code == 422 and api.json()["error"]["message"].startswith("mine.pt: malformed checkpoint")
        assert expected in api.json()["error"]["message"]

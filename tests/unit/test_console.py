"""The web console's security properties in-process (FastAPI TestClient, fakeredis, a mocked retriever):
sessions, CSRF, headers, scopes, escaping of hostile strings, and that no page answers 5xx. The same flows in a
real browser against the real stack: tests/e2e/test_console_browser.py."""

from __future__ import annotations

import io
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image
from rq.job import JobStatus

from t3ar.clients.retriever import RetrieverClient
from t3ar.models.backbones import BackboneSpec
from t3ar.models.checkpoint import save_checkpoint
from t3ar.models.classifier import ModelSpec, build_classifier
from t3ar_services.api.console.session import SESSION_COOKIE, Sessions
from t3ar_services.api.main import create_app
from t3ar_services.api.settings import ApiSettings
from t3ar_services.common.job_contract import LINEAGE_FILE, REPORT_FILE, artifacts_dir, write_json_atomic

HOSTILE = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'
JS_URL = "javascript:alert(3)"
SECRET = "console-test-secret-0123456789"


def _png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _item(pid: str) -> dict[str, Any]:
    return {"id": pid, "sha256": "0" * 64, "source": HOSTILE, "metadata": {"caption": HOSTILE, "url": JS_URL,
                                                                          HOSTILE: "key"},
            "filename": f"{HOSTILE}.png", "media_type": "image/png", "size": 100, "width": 16, "height": 16,
            "added_at": 0.0}


def _retriever(pool: dict[str, Any]) -> httpx.MockTransport:
    def handle(req: httpx.Request) -> httpx.Response:
        path = req.url.path
        if path == "/stats":
            return httpx.Response(200, json={"count": len(pool["ids"]), "identity": "fake",
                                             "sources": {HOSTILE: len(pool["ids"])}})
        if path == "/pool" and req.method == "GET":
            return httpx.Response(200, json={"items": [_item(p) for p in sorted(pool["ids"])], "next_after": None,
                                             "total": len(pool["ids"])})
        if path == "/search":
            ids = sorted(pool["ids"])
            return httpx.Response(200, json={"results": [{"ids": ids, "scores": [0.9] * len(ids)}],
                                             "identity": "fake"})
        m = re.fullmatch(r"/pool/([^/]+)(/image)?", path)
        if m:
            pid = m.group(1)
            if pid not in pool["ids"]:
                return httpx.Response(404, json={"error": {"code": "not_found", "message": f"no item {pid}"}})
            if req.method == "DELETE":
                assert req.headers["authorization"] == "Bearer r-admin"
                pool["ids"].remove(pid)
                pool["deleted"].append(pid)
                return httpx.Response(200, json={"deleted": [pid], "not_found": []})
            if m.group(2):
                return httpx.Response(200, content=_png(1), headers={"content-type": "image/png"})
            return httpx.Response(200, json=_item(pid))
        return httpx.Response(404, json={"error": {"code": "not_found", "message": "?"}})

    return httpx.MockTransport(handle)


def _settings(tmp_path: Path, **kw: Any) -> ApiSettings:
    base: dict[str, Any] = dict(data_dir=tmp_path / "data", token="user-t", admin_token="admin-t",
                                worker_token="worker-t", retriever_admin_token="r-admin", validate_threads=0,
                                sweep_interval=3600, session_secret=SECRET)
    return ApiSettings(**{**base, **kw})


def _app(settings: ApiSettings, pool: dict[str, Any]) -> Any:
    app = create_app(settings, redis=fakeredis.FakeRedis())
    state = app.state.api
    state.retriever = RetrieverClient("http://r", "r-rw", transport=_retriever(pool), retries=0)
    state.retriever_admin = RetrieverClient("http://r", "r-admin", transport=_retriever(pool), retries=0)
    return app


@pytest.fixture()
def pool() -> dict[str, Any]:
    return {"ids": {"p-1", "p-2"}, "deleted": []}


@pytest.fixture()
def client(tmp_path: Path, pool: dict[str, Any]) -> Iterator[TestClient]:
    with TestClient(_app(_settings(tmp_path), pool)) as c:
        yield c


def csrf_of(html: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', html)
    assert m, html[:2000]
    return m.group(1)


def sign_in(client: TestClient, token: str) -> httpx.Response:
    page = client.get("/ui/login")
    return client.post("/ui/login", data={"csrf": csrf_of(page.text), "token": token, "next": "/ui/jobs"},
                       follow_redirects=False)


def signed_in(client: TestClient, token: str = "user-t") -> str:
    """Signs in; returns the CSRF token of the session."""
    resp = sign_in(client, token)
    assert resp.status_code == 303 and resp.headers["location"] == "/ui/jobs", resp.text
    return csrf_of(client.get("/ui/jobs").text)


def _model_file(tmp_path: Path) -> bytes:
    spec = ModelSpec(backbone=BackboneSpec(name="mobilenetv2_050", weights="none"), classes=("a", "b"), image_size=32)
    save_checkpoint(tmp_path / "m.pt", build_classifier(spec), spec)
    return (tmp_path / "m.pt").read_bytes()


# --- sessions ----------------------------------------------------------------------------------------------

def test_pages_need_a_session_and_redirect_to_sign_in(client: TestClient) -> None:
    for path in ("/ui/jobs", "/ui/pool", "/ui/models", "/ui/pool/p-1", "/ui/pool/search"):
        resp = client.get(path, follow_redirects=False)
        assert resp.status_code == 303 and resp.headers["location"].startswith("/ui/login?next=/ui/"), path
    assert client.get("/ui/pool/p-1/image", follow_redirects=False).status_code == 303  # images too
    # a POST without a session is turned away before its body is read (nothing registered, nothing deleted)
    resp = client.post("/ui/models", files={"file": ("m.pt", b"x" * 100_000)}, follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"] == "/ui/login?next=/ui/jobs"
    assert client.get("/models", headers={"Authorization": "Bearer user-t"}).json() == {"models": []}


def test_a_link_from_another_site_reloads_once_from_this_origin(client: TestClient) -> None:
    """SameSite=Strict: the cookie is not sent on a cross-site navigation; the reload from our own page sends it."""
    resp = client.get("/ui/jobs/x", headers={"Sec-Fetch-Site": "cross-site"}, follow_redirects=False)
    assert resp.status_code == 200 and '<meta http-equiv="refresh" content="0">' in resp.text
    again = client.get("/ui/jobs/x", headers={"Sec-Fetch-Site": "same-origin"}, follow_redirects=False)
    assert again.status_code == 303 and again.headers["location"] == "/ui/login?next=/ui/jobs/x"


def test_sign_in_sets_a_signed_httponly_strict_cookie_and_never_echoes_the_token(client: TestClient) -> None:
    resp = sign_in(client, "user-t")
    assert resp.status_code == 303
    cookie = next(v for k, v in resp.headers.multi_items() if k == "set-cookie" and v.startswith(SESSION_COOKIE))
    attrs = [a.strip().lower() for a in cookie.split(";")]
    assert "httponly" in attrs and "samesite=strict" in attrs and "path=/ui" in attrs and "secure" not in attrs
    assert "max-age=28800" in attrs
    assert "user-t" not in cookie and "user-t" not in resp.text and "user-t" not in resp.headers["location"]
    page = client.get("/ui/jobs")
    assert page.status_code == 200 and "user-t" not in page.text and 'id="scope">user<' in page.text


def test_cookie_is_secure_over_https(tmp_path: Path, pool: dict[str, Any]) -> None:
    with TestClient(_app(_settings(tmp_path), pool), base_url="https://testserver") as c:
        resp = sign_in(c, "admin-t")
        cookie = next(v for k, v in resp.headers.multi_items() if k == "set-cookie" and v.startswith(SESSION_COOKIE))
        assert "secure" in [a.strip().lower() for a in cookie.split(";")]


def test_unknown_and_worker_tokens_cannot_sign_in(client: TestClient) -> None:
    for token in ("nope", "worker-t", ""):
        resp = sign_in(client, token)
        assert resp.status_code == 401 and SESSION_COOKIE not in resp.headers.get("set-cookie", "")
        assert "unknown token" in resp.text and token not in re.findall(r'value="([^"]*)"', resp.text)
    assert client.get("/ui/jobs", follow_redirects=False).status_code == 303


def test_sign_in_without_its_csrf_token_is_refused(client: TestClient) -> None:
    client.get("/ui/login")
    resp = client.post("/ui/login", data={"token": "user-t"}, follow_redirects=False)
    assert resp.status_code == 403 and SESSION_COOKIE not in resp.headers.get("set-cookie", "")
    other = Sessions(_settings(Path("/nonexistent"))).csrf_for("another-nonce")
    resp = client.post("/ui/login", data={"token": "user-t", "csrf": other}, follow_redirects=False)
    assert resp.status_code == 403


def test_sign_in_body_is_bounded(client: TestClient) -> None:
    page = client.get("/ui/login")
    resp = client.post("/ui/login", data={"csrf": csrf_of(page.text), "token": "x" * 20_000})
    assert resp.status_code == 413


def test_sessions_expire_and_forged_cookies_are_refused(tmp_path: Path) -> None:
    s = Sessions(_settings(tmp_path))
    cookie = s.issue("user-t", now=1000.0)
    assert s.read(cookie, now=1001.0) is not None
    assert s.read(cookie, now=1000.0 + s.ttl + 1) is None
    body, mac = cookie.split(".")
    assert s.read(f"{body}.{mac[:-2]}AA", now=1001.0) is None
    assert s.read(cookie.replace(body, body[:-2] + "AA"), now=1001.0) is None
    assert Sessions(_settings(tmp_path, session_secret="another-secret-0123")).read(cookie, now=1001.0) is None


def test_a_rotated_token_ends_its_sessions_at_the_next_request(tmp_path: Path, pool: dict[str, Any]) -> None:
    with TestClient(_app(_settings(tmp_path), pool)) as c:
        signed_in(c, "user-t")
        cookie = c.cookies.get(SESSION_COOKIE)
    assert cookie
    # the same API restarted with the same session secret: the session survives...
    with TestClient(_app(_settings(tmp_path), pool)) as c:
        c.cookies.set(SESSION_COOKIE, cookie, path="/ui")
        assert c.get("/ui/jobs", follow_redirects=False).status_code == 200
    # ...but not once the user token was rotated (or revoked: the admin token alone cannot read it either)
    with TestClient(_app(_settings(tmp_path, token="user-t2"), pool)) as c:
        c.cookies.set(SESSION_COOKIE, cookie, path="/ui")
        resp = c.get("/ui/jobs", follow_redirects=False)
        assert resp.status_code == 303 and resp.headers["location"].startswith("/ui/login")


def test_sign_out_clears_the_cookie_and_needs_csrf(client: TestClient) -> None:
    csrf = signed_in(client)
    assert client.post("/ui/logout", data={}, follow_redirects=False).status_code == 403
    resp = client.post("/ui/logout", data={"csrf": csrf}, follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"] == "/ui/login"
    assert client.get("/ui/jobs", follow_redirects=False).status_code == 303


# --- CSRF, headers ----------------------------------------------------------------------------------------

def test_every_post_without_the_csrf_token_is_refused(client: TestClient, pool: dict[str, Any],
                                                      tmp_path: Path) -> None:
    signed_in(client, "admin-t")
    for path in ("/ui/logout", "/ui/jobs/nope/cancel", "/ui/jobs/nope/readapt", "/ui/pool/p-1/withdraw",
                 "/ui/pool/p-1/readapt"):
        for data in ({}, {"csrf": "forged"}):
            resp = client.post(path, data=data, follow_redirects=False)
            assert resp.status_code == 403 and "CSRF" in resp.text, (path, data)
    resp = client.post("/ui/models", files={"file": ("m.pt", _model_file(tmp_path))}, data={"name": "m"})
    assert resp.status_code == 403
    resp = client.post("/ui/pool/search", files={"image": ("q.png", _png(3))})
    assert resp.status_code == 403
    assert pool["deleted"] == [] and client.get("/models", headers={"Authorization": "Bearer user-t"}).json() == {
        "models": []}


def test_sign_in_goes_back_only_to_a_console_page() -> None:
    from t3ar_services.api.console.web import safe_next

    assert safe_next("/ui/pool/p-1?after=x") == "/ui/pool/p-1?after=x"
    for bad in ("https://evil.example/", "//evil.example/ui/", "/ui//evil.example", "/ui/\\evil", "/ui/a\r\nX: y",
                "javascript:alert(1)", "/ui/login", "/elsewhere", None, ""):
        assert safe_next(bad) == "/ui/jobs", bad


def test_cross_origin_posts_are_refused(client: TestClient) -> None:
    csrf = signed_in(client)
    same = client.post("/ui/jobs/nope/cancel", data={"csrf": csrf}, headers={"Origin": "https://testserver"})
    assert same.status_code == 404  # the host matches (a TLS proxy in front): on to the route
    resp = client.post("/ui/logout", data={"csrf": csrf}, headers={"Origin": "https://evil.example"},
                       follow_redirects=False)
    assert resp.status_code == 403


def test_security_headers_and_no_inline_script_on_every_page(client: TestClient) -> None:
    login = client.get("/ui/login")
    signed_in(client, "admin-t")
    pages = [login] + [client.get(p) for p in ("/ui/jobs", "/ui/pool", "/ui/pool/p-1", "/ui/pool/p-1/withdraw",
                                               "/ui/models", "/ui/pool/search", "/ui/jobs/nope")]
    for resp in pages:
        csp = resp.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp
        assert resp.headers["x-content-type-options"] == "nosniff" and resp.headers["x-frame-options"] == "DENY"
        assert "<script" not in resp.text.lower() and " style=" not in resp.text.lower() and " on" not in \
            re.sub(r">[^<]*<", "><", resp.text).lower().replace(" one", ""), resp.url
    assert client.get("/ui/static/console.css").headers["x-content-type-options"] == "nosniff"


# --- scopes ---------------------------------------------------------------------------------------------

def test_a_user_session_cannot_withdraw(client: TestClient, pool: dict[str, Any]) -> None:
    csrf = signed_in(client, "user-t")
    assert 'id="withdraw"' not in client.get("/ui/pool/p-1").text
    assert client.get("/ui/pool/p-1/withdraw").status_code == 403
    resp = client.post("/ui/pool/p-1/withdraw", data={"csrf": csrf})
    assert resp.status_code == 403 and "admin token" in resp.text and pool["deleted"] == []


def test_an_admin_withdraws_after_confirming_and_is_offered_readapt(client: TestClient, pool: dict[str, Any],
                                                                    tmp_path: Path) -> None:
    csrf = signed_in(client, "admin-t")
    data = tmp_path / "data"
    job_id = "j" * 32
    art = artifacts_dir(data, job_id)
    art.mkdir(parents=True)
    write_json_atomic(art / LINEAGE_FILE, {"pool_ids": ["p-1"], "created_at": "2026-01-01T00:00:00+00:00",
                                          "checkpoint_sha256": "0" * 64})
    assert 'id="withdraw"' in client.get("/ui/pool/p-1").text
    confirm = client.get("/ui/pool/p-1/withdraw")
    assert confirm.status_code == 200 and job_id[:12] in confirm.text and pool["deleted"] == []
    posted = client.post("/ui/pool/p-1/withdraw", data={"csrf": csrf}, follow_redirects=False)
    assert posted.status_code == 303 and posted.headers["location"] == "/ui/pool/p-1/withdrawn"  # reload-safe
    assert pool["deleted"] == ["p-1"]
    done = client.get("/ui/pool/p-1/withdrawn")
    assert done.status_code == 200
    assert 'id="readapt-affected"' in done.text and job_id[:12] in done.text
    gone = client.get("/ui/pool/p-1")
    assert gone.status_code == 200 and "withdrawn" in gone.text and job_id[:12] in gone.text  # lineage stays


# --- escaping, no 5xx ---------------------------------------------------------------------------------------

def _finished_job(client: TestClient, tmp_path: Path, csrf: str) -> str:
    """A job submitted through the JSON API, finished the way a worker finishes it (artifacts on disk)."""
    model = _model_file(tmp_path)
    resp = client.post("/ui/models", files={"file": (f"{HOSTILE}.pt", model)}, data={"name": HOSTILE, "csrf": csrf},
                       follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"].startswith("/ui/models?uploaded=")  # reload-safe
    resp = client.get(resp.headers["location"])
    assert resp.status_code == 200 and 'id="uploaded">Uploaded:' in resp.text, resp.text
    model_id = client.get("/models", headers={"Authorization": "Bearer user-t"}).json()["models"][0]["id"]
    buf = io.BytesIO()
    import zipfile

    with zipfile.ZipFile(buf, "w") as zf:
        for i in range(4):
            zf.writestr(f"imgs/{'ab'[i % 2]}{i}.png", _png(i))
    resp = client.post("/adapt", files={"archive": ("t.zip", buf.getvalue())},
                       data={"model_id": model_id, "config": json.dumps({"method": "t3ar", "k": 2, "epochs": 1})},
                       headers={"Authorization": "Bearer user-t"})
    assert resp.status_code == 202, resp.text
    job_id = str(resp.json()["id"])
    art = artifacts_dir(tmp_path / "data", job_id)
    art.mkdir(parents=True)
    report = {"epochs": [{"epoch": 0, "loss": 2.0, "loss_ce": 1.0, "loss_contrastive": 1.0, "pl_change_rate": 0.5}],
              "step_history": [{"step": i, "epoch": 0, "loss": 2.0 - i / 10, "loss_ce": 1.0, "loss_contrastive": 1.0,
                                "pl_change_rate": 0.5 - i / 20} for i in range(5)],
              "accuracy": {"before": {"top1": 0.4}, "after": {"top1": 0.6}},
              "neighbour_sample": [{"target": "imgs/a0.png", "neighbours": [{"id": "p-1", "score": 0.91},
                                                                            {"id": "p-2", "score": 0.5}]}]}
    write_json_atomic(art / REPORT_FILE, report)
    (art / "model.pt").write_bytes(model)
    write_json_atomic(art / LINEAGE_FILE, {"pool_ids": ["p-1", "p-2"], "checkpoint_sha256": "0" * 64})
    client.app.state.api.jobs.fetch(job_id).delete()  # type: ignore[attr-defined]  # rq forgot it: disk says finished
    return job_id


def test_hostile_strings_render_as_text_on_every_page(client: TestClient, tmp_path: Path) -> None:
    csrf = signed_in(client, "admin-t")
    job_id = _finished_job(client, tmp_path, csrf)
    pages = {p: client.get(p) for p in ("/ui/pool", f"/ui/pool?source={HOSTILE}", "/ui/pool/p-1",
                                        "/ui/pool/p-1/withdraw", "/ui/models", f"/ui/jobs/{job_id}", "/ui/jobs",
                                        f"/ui/pool/{HOSTILE}")}
    search = client.post("/ui/pool/search", files={"image": (f"{HOSTILE}.png", _png(3))}, data={"csrf": csrf})
    pages["search"] = search
    failed = client.post(f"/ui/jobs/{job_id}/readapt", data={"csrf": csrf}, follow_redirects=False)
    failed_id = failed.headers["location"].rsplit("/", 1)[1]
    rq_job = client.app.state.api.jobs.fetch(failed_id)  # type: ignore[attr-defined]
    rq_job.meta["error"] = f"{HOSTILE} {JS_URL}"  # what a worker writes when a job fails
    rq_job.save_meta()
    rq_job.set_status(JobStatus.FAILED)
    pages["failed job"] = client.get(f"/ui/jobs/{failed_id}")
    shown = {"/ui/pool", f"/ui/pool?source={HOSTILE}", "/ui/pool/p-1", "/ui/pool/p-1/withdraw", "/ui/models",
             "search", "failed job"}
    for path, resp in pages.items():
        assert resp.status_code < 500, path
        assert "<script>alert" not in resp.text and "<img src=x" not in resp.text, path
        assert 'href="javascript:' not in resp.text and 'src="javascript:' not in resp.text, path
        if path in shown:
            assert "&lt;script&gt;alert(1)&lt;/script&gt;" in resp.text, path
    assert JS_URL in pages["/ui/pool/p-1"].text  # shown as text, never as a link


def test_job_page_shows_charts_neighbours_and_lineage(client: TestClient, tmp_path: Path) -> None:
    csrf = signed_in(client)
    job_id = _finished_job(client, tmp_path, csrf)
    page = client.get(f"/ui/jobs/{job_id}")
    assert page.status_code == 200
    assert page.text.count("<polyline") == 4 and "accuracy on the target" in page.text and "60.0 %" in page.text
    assert f"/ui/jobs/{job_id}/target/imgs/a0.png" in page.text and "0.910" in page.text
    assert page.text.count('/ui/pool/p-1/image') >= 2  # neighbour and lineage thumbnails
    gone = client.get("/ui/pool/withdrawn-id/image")  # a withdrawn item's lineage thumbnail: a placeholder picture
    assert gone.status_code == 404 and gone.headers["content-type"] == "image/png"
    thumb = client.get(f"/ui/jobs/{job_id}/target/imgs/a0.png")
    assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/png"
    assert client.get(f"/ui/jobs/{job_id}/target/../../../api.sqlite3").status_code == 404
    assert client.get(f"/ui/jobs/{job_id}/target/%2e%2e/%2e%2e/api.sqlite3").status_code == 404
    ck = client.get(f"/ui/jobs/{job_id}/checkpoint")
    assert ck.status_code == 200 and ck.content == (tmp_path / "m.pt").read_bytes()
    rep = client.get(f"/ui/jobs/{job_id}/report")
    assert rep.status_code == 200 and "attachment" in rep.headers["content-disposition"]
    (tmp_path / "data" / "artifacts" / job_id / REPORT_FILE).unlink()  # lost: the page shows the rest
    page = client.get(f"/ui/jobs/{job_id}")
    assert page.status_code == 200 and 'id="lineage"' in page.text and "<polyline" not in page.text
    assert client.get(f"/ui/jobs/{job_id}/report").status_code == 404


def test_after_a_withdrawal_the_affected_jobs_are_readapted_from_the_console(client: TestClient, tmp_path: Path,
                                                                            pool: dict[str, Any]) -> None:
    csrf = signed_in(client, "admin-t")
    job_id = _finished_job(client, tmp_path, csrf)
    pool["ids"] |= {"p-3", "p-4"}  # k=2 neighbours need 2 items left after the withdrawal
    done = client.post("/ui/pool/p-2/withdraw", data={"csrf": csrf})
    assert done.status_code == 200 and pool["deleted"] == ["p-2"] and job_id[:12] in done.text
    posted = client.post("/ui/pool/p-2/readapt", data={"csrf": csrf}, follow_redirects=False)
    assert posted.status_code == 303 and posted.headers["location"].startswith("/ui/pool/p-2/readapted?jobs=")
    resp = client.get(posted.headers["location"])
    assert resp.status_code == 200 and job_id[:12] in resp.text
    new_ids = re.findall(r'href="/ui/jobs/([0-9a-f]{32})"', resp.text)
    assert len(new_ids) == 1 and new_ids[0] != job_id
    new = client.get(f"/jobs/{new_ids[0]}", headers={"Authorization": "Bearer user-t"}).json()
    assert new["parent_id"] == job_id and new["status"] == "queued"  # through POST /jobs/{id}/readapt's code


def test_no_console_page_answers_5xx(client: TestClient, tmp_path: Path) -> None:
    csrf = signed_in(client, "admin-t")
    job_id = _finished_job(client, tmp_path, csrf)
    paths = ["/ui", "/ui/login", "/ui/jobs", "/ui/jobs?before=nope", f"/ui/jobs/{job_id}", "/ui/jobs/nope",
             f"/ui/jobs/{job_id}/report", f"/ui/jobs/{job_id}/checkpoint", "/ui/jobs/nope/checkpoint",
             "/ui/jobs/nope/target/x.png", "/ui/pool", "/ui/pool?after=zzz&source=nope", "/ui/pool/p-1",
             "/ui/pool/p-1/image", "/ui/pool/nope", "/ui/pool/nope/image", "/ui/pool/nope/withdraw",
             "/ui/pool/search", "/ui/models", "/ui/nope"]
    for path in paths:
        assert client.get(path).status_code < 500, path
    for path, files in (("/ui/pool/search", {"image": ("x.png", b"not an image")}),
                        ("/ui/models", {"file": ("x.pt", b"not a checkpoint")})):
        assert client.post(path, files=files, data={"csrf": csrf}).status_code < 500, path
    assert client.post("/ui/jobs/nope/cancel", data={"csrf": csrf}).status_code == 404
    ended = client.post(f"/ui/jobs/{job_id}/cancel", data={"csrf": csrf})
    assert ended.status_code == 409 and "already finished" in ended.text


def test_cancel_and_readapt_from_the_job_page(client: TestClient, tmp_path: Path) -> None:
    csrf = signed_in(client)
    job_id = _finished_job(client, tmp_path, csrf)
    resp = client.post(f"/ui/jobs/{job_id}/readapt", data={"csrf": csrf}, follow_redirects=False)
    assert resp.status_code == 303
    new = resp.headers["location"].rsplit("/", 1)[1]
    page = client.get(f"/ui/jobs/{new}")
    assert "queued" in page.text and "Readapt of" in page.text and 'http-equiv="refresh"' in page.text
    assert 'id="cancel"' in page.text
    client.post(f"/ui/jobs/{new}/cancel", data={"csrf": csrf})
    assert 'id="job-status">canceled<' in client.get(f"/ui/jobs/{new}").text


def test_the_json_api_is_unchanged(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    assert not [p for p in doc["paths"] if p.startswith("/ui")]
    resp = client.post("/adapt", files={"archive": ("t.zip", b"x")})
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "unauthorized"  # credentials first
    assert "content-security-policy" not in client.get("/health").headers


def test_a_short_session_secret_is_refused_at_start_up(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="T3AR_API_SESSION_SECRET must be at least 16"):
        _settings(tmp_path, session_secret="")
    assert Sessions(_settings(tmp_path, session_secret=None)).read(Sessions(_settings(tmp_path)).issue("user-t")) \
        is None  # unset: a random key, so another process' cookie is not valid here


def test_session_ttl_is_a_setting(tmp_path: Path) -> None:
    s = Sessions(_settings(tmp_path, session_ttl=60))
    cookie = s.issue("admin-t")
    found = s.read(cookie)
    assert found is not None and found.admin and found.expires <= time.time() + 60

"""The console's sessions and request security in-process (TestClient): sign-in, the cookie, expiry, rotation,
sign-out, CSRF on every POST, origin, headers, and that the JSON API is unchanged. In a real browser:
tests/e2e/test_console_browser.py."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from console_kit import (
    app_for,
    csrf_of,
    model_file,
    png_image,
    settings_for,
    sign_in,
    signed_in,
)
from console_kit import client as client  # the fixtures
from console_kit import pool as pool
from fastapi.testclient import TestClient

from t3ar_services.api.console.session import LOGIN_COOKIE, SESSION_COOKIE, Sessions


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


@pytest.mark.parametrize(("mode", "base", "secure"), [("auto", "https://testserver", True),
                                                      ("auto", "http://testserver", False),
                                                      ("true", "http://testserver", True),  # TLS ends at a proxy
                                                      ("false", "https://testserver", False)])
def test_cookie_is_secure_over_https_or_when_told(tmp_path: Path, pool: dict[str, Any], mode: str, base: str,
                                                  secure: bool) -> None:
    def flag(resp: httpx.Response, name: str) -> bool:
        cookie = next(v for k, v in resp.headers.multi_items() if k == "set-cookie" and v.startswith(name))
        return "secure" in [a.strip().lower() for a in cookie.split(";")]

    with TestClient(app_for(settings_for(tmp_path, cookie_secure=mode), pool), base_url=base) as c:
        assert flag(c.get("/ui/login"), LOGIN_COOKIE) is secure
        if base.startswith("https") or not secure:  # (a test client on http does not send a Secure cookie back)
            assert flag(sign_in(c, "admin-t"), SESSION_COOKIE) is secure


def test_unknown_and_worker_tokens_cannot_sign_in(client: TestClient) -> None:
    for token in ("nope", "worker-t", ""):
        resp = sign_in(client, token)
        assert resp.status_code == 401 and SESSION_COOKIE not in resp.headers.get("set-cookie", "")
        said = "service token that never signs in" if token == "worker-t" else "unknown token"  # issue 50
        assert said in resp.text and token not in re.findall(r'value="([^"]*)"', resp.text)
    assert client.get("/ui/jobs", follow_redirects=False).status_code == 303


def test_sign_in_without_its_csrf_token_is_refused(client: TestClient) -> None:
    client.get("/ui/login")
    resp = client.post("/ui/login", data={"token": "user-t"}, follow_redirects=False)
    assert resp.status_code == 403 and SESSION_COOKIE not in resp.headers.get("set-cookie", "")
    other = Sessions(settings_for(Path("/nonexistent"))).csrf_for("another-nonce")
    resp = client.post("/ui/login", data={"token": "user-t", "csrf": other}, follow_redirects=False)
    assert resp.status_code == 403


def test_sign_in_body_is_bounded(client: TestClient) -> None:
    page = client.get("/ui/login")
    resp = client.post("/ui/login", data={"csrf": csrf_of(page.text), "token": "x" * 20_000})
    assert resp.status_code == 413


def test_sessions_expire_and_forged_cookies_are_refused(tmp_path: Path) -> None:
    s = Sessions(settings_for(tmp_path))
    cookie = s.issue("user-t", now=1000.0)
    assert s.read(cookie, now=1001.0) is not None
    assert s.read(cookie, now=1000.0 + s.ttl + 1) is None
    body, mac = cookie.split(".")
    assert s.read(f"{body}.{mac[:-2]}AA", now=1001.0) is None
    assert s.read(cookie.replace(body, body[:-2] + "AA"), now=1001.0) is None
    assert Sessions(settings_for(tmp_path, session_secret="another-secret-0123")).read(cookie, now=1001.0) is None


def test_a_rotated_token_ends_its_sessions_at_the_next_request(tmp_path: Path, pool: dict[str, Any]) -> None:
    with TestClient(app_for(settings_for(tmp_path), pool)) as c:
        signed_in(c, "user-t")
        cookie = c.cookies.get(SESSION_COOKIE)
    assert cookie
    # the same API restarted with the same session secret: the session survives...
    with TestClient(app_for(settings_for(tmp_path), pool)) as c:
        c.cookies.set(SESSION_COOKIE, cookie, path="/ui")
        assert c.get("/ui/jobs", follow_redirects=False).status_code == 200
    # ...but not once the user token was rotated (or revoked: the admin token alone cannot read it either)
    with TestClient(app_for(settings_for(tmp_path, token="user-t2"), pool)) as c:
        c.cookies.set(SESSION_COOKIE, cookie, path="/ui")
        resp = c.get("/ui/jobs", follow_redirects=False)
        assert resp.status_code == 303 and resp.headers["location"].startswith("/ui/login")


def test_sign_out_clears_the_cookie_and_needs_csrf(client: TestClient) -> None:
    csrf = signed_in(client)
    assert client.post("/ui/logout", data={}, follow_redirects=False).status_code == 403
    resp = client.post("/ui/logout", data={"csrf": csrf}, follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"] == "/ui/login"
    assert client.get("/ui/jobs", follow_redirects=False).status_code == 303


def test_a_short_session_secret_is_refused_at_start_up(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="T3AR_API_SESSION_SECRET must be at least 16"):
        settings_for(tmp_path, session_secret="")
    cookie = Sessions(settings_for(tmp_path)).issue("user-t")
    assert Sessions(settings_for(tmp_path, session_secret=None)).read(cookie) is None  # unset: a random key


def test_session_ttl_is_a_setting(tmp_path: Path) -> None:
    s = Sessions(settings_for(tmp_path, session_ttl=60))
    cookie = s.issue("admin-t")
    found = s.read(cookie)
    assert found is not None and found.admin and found.expires <= time.time() + 60


def test_every_post_without_the_csrf_token_is_refused(client: TestClient, pool: dict[str, Any],
                                                      tmp_path: Path) -> None:
    signed_in(client, "admin-t")
    for path in ("/ui/logout", "/ui/jobs/nope/cancel", "/ui/jobs/nope/readapt", "/ui/pool/p-1/withdraw",
                 "/ui/pool/p-1/readapt"):
        for data in ({}, {"csrf": "forged"}):
            resp = client.post(path, data=data, follow_redirects=False)
            assert resp.status_code == 403 and "CSRF" in resp.text, (path, data)
    resp = client.post("/ui/models", files={"file": ("m.pt", model_file(tmp_path))}, data={"name": "m"})
    assert resp.status_code == 403
    resp = client.post("/ui/pool/search", files={"image": ("q.png", png_image(3))})
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
                                               "/ui/models", "/ui/pool/search", "/ui/jobs/nope", "/ui/submit",
                                               "/ui/pool/ingest")]
    own_script = '<script src="/ui/static/console.js" defer></script>'  # the one script: a file of the service
    for resp in pages:
        assert resp.status_code in (200, 404), resp.url
        csp = resp.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp
        assert resp.headers["x-content-type-options"] == "nosniff" and resp.headers["x-frame-options"] == "DENY"
        assert resp.text.count(own_script) == 1, resp.url
        text = resp.text.replace(own_script, "")
        assert "<script" not in text.lower() and " style=" not in text.lower() and " on" not in \
            re.sub(r">[^<]*<", "><", text).lower().replace(" one", ""), resp.url
    assert client.get("/ui/static/console.css").headers["x-content-type-options"] == "nosniff"
    script = client.get("/ui/static/console.js")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert "http://" not in script.text and "https://" not in script.text  # no external asset


def test_the_json_api_is_unchanged(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    assert not [p for p in doc["paths"] if p.startswith("/ui")]
    resp = client.post("/adapt", files={"archive": ("t.zip", b"x")})
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "unauthorized"  # credentials first
    assert "content-security-policy" not in client.get("/health").headers

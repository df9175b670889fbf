"""Signing out ends the session on the server (issue 34, G4): the saved cookie opens nothing afterwards, while
other sessions of the same token go on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from console_kit import console_client, new_pool, settings_for, signed_in
from fastapi.testclient import TestClient

from t3ar_services.api.console.session import SESSION_COOKIE, Sessions


@pytest.fixture()
def client(tmp_path: Path) -> Iterator[TestClient]:
    yield from console_client(tmp_path, new_pool())


def _opens(client: TestClient, cookie: str) -> bool:
    client.cookies.clear()
    client.cookies.set(SESSION_COOKIE, cookie, path="/ui")
    return client.get("/ui/jobs", follow_redirects=False).status_code == 200


def test_a_saved_cookie_opens_nothing_after_sign_out(client: TestClient) -> None:
    csrf = signed_in(client)
    saved = client.cookies.get(SESSION_COOKIE, path="/ui")
    assert saved and _opens(client, saved)
    client.cookies.clear()
    other_csrf = signed_in(client)  # a second sign-in of the same token: another session
    other = client.cookies.get(SESSION_COOKIE, path="/ui")
    assert other and other != saved and other_csrf
    client.cookies.clear()
    client.cookies.set(SESSION_COOKIE, saved, path="/ui")
    assert client.post("/ui/logout", data={"csrf": csrf}, follow_redirects=False).status_code == 303
    assert not _opens(client, saved)  # the cookie a copy was kept of: signed out on the server
    assert _opens(client, other)


def test_revocations_are_bounded_and_forgotten_at_expiry(tmp_path: Path) -> None:
    sessions = Sessions(settings_for(tmp_path, session_ttl=60))
    cookies = [sessions.issue("user-t", now=1000.0 + i) for i in range(5)]
    for cookie in cookies:
        found = sessions.read(cookie, now=1010.0)
        assert found is not None
        sessions.revoke(found, now=1010.0)
        assert sessions.read(cookie, now=1010.0) is None
    assert len(sessions.revoked) == 5
    sessions.revoke(sessions.read(sessions.issue("user-t", now=2000.0), now=2000.0), now=2000.0)  # type: ignore[arg-type]
    assert len(sessions.revoked) == 1  # the expired ones are no longer kept: their cookies are refused anyway

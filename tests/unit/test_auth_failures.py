"""Failed sign-ins per client address (issue 34, G5): past the budget a client is answered 429 with Retry-After
on the JSON API (bearer tokens) and the console's sign-in, the right token included, until the window lets it
try again; other addresses are not affected."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from asgi_kit import call
from console_kit import app_for, csrf_of, new_pool, settings_for
from fastapi.testclient import TestClient

from t3ar_services.api.console.session import SESSION_COOKIE
from t3ar_services.common.auth_failures import FailureWindow


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def clock() -> Clock:
    return Clock()


@pytest.fixture()
def client(tmp_path: Path, clock: Clock) -> Iterator[TestClient]:
    app = app_for(settings_for(tmp_path, auth_failures=3, auth_failure_window=60), new_pool())
    app.state.auth_failures.clock = clock
    with TestClient(app) as c:
        yield c


def test_the_window_counts_failures_and_frees_the_oldest_first(clock: Clock) -> None:
    window = FailureWindow(2, 10.0, max_clients=2, clock=clock)
    window.failed("a")
    assert window.retry_after("a") is None
    clock.now += 4
    window.failed("a")
    assert window.retry_after("a") == 6 and window.retry_after("b") is None
    clock.now += 6
    assert window.retry_after("a") is None  # the first failure left the window: one more try
    window.failed("b")
    window.failed("c")  # a third address: the least recent one ("a") is forgotten
    window.failed("c")
    assert window.retry_after("c") is not None and "a" not in window._failures


def test_wrong_bearer_tokens_are_limited_per_address(client: TestClient, clock: Clock) -> None:
    for _ in range(3):
        assert client.get("/jobs", headers={"Authorization": "Bearer wrong"}).status_code == 401
    blocked = client.get("/jobs", headers={"Authorization": "Bearer user-t"})  # even the right one, for now
    assert blocked.status_code == 429 and int(blocked.headers["retry-after"]) == 60, blocked.text
    assert client.post("/jobs/x/cancel", headers={"Authorization": "Bearer admin-t"}).status_code == 429
    elsewhere = call(client.app, "GET", "/jobs", [("authorization", "Bearer user-t")])  # another address
    assert elsewhere.status == 200, elsewhere
    assert client.get("/health").status_code == 200
    clock.now += 30
    assert int(client.get("/jobs", headers={"Authorization": "Bearer user-t"}).headers["retry-after"]) == 30
    clock.now += 30
    assert client.get("/jobs", headers={"Authorization": "Bearer user-t"}).status_code == 200  # after the window


def test_right_tokens_do_not_count(client: TestClient) -> None:
    for _ in range(10):
        assert client.get("/jobs", headers={"Authorization": "Bearer user-t"}).status_code == 200
    assert client.get("/jobs", headers={"Authorization": "Bearer worker-t"}).status_code == 403  # known, no scope


def _sign_in(client: TestClient, token: str) -> int:
    page = client.get("/ui/login")
    resp = client.post("/ui/login", data={"csrf": csrf_of(page.text), "token": token, "next": "/ui/jobs"},
                       follow_redirects=False)
    return resp.status_code


def test_console_sign_ins_are_limited_per_address(client: TestClient, clock: Clock) -> None:
    assert [_sign_in(client, "wrong") for _ in range(3)] == [401, 401, 401]
    page = client.get("/ui/login")
    blocked = client.post("/ui/login", data={"csrf": csrf_of(page.text), "token": "user-t", "next": "/ui/jobs"},
                          follow_redirects=False)
    assert blocked.status_code == 429 and blocked.headers["retry-after"] == "60"
    assert blocked.headers["content-type"].startswith("text/html") and "content-security-policy" in blocked.headers
    assert "try again in 60 s" in blocked.text and SESSION_COOKIE not in blocked.cookies
    clock.now += 61
    assert _sign_in(client, "user-t") == 303


def test_worker_routes_have_their_own_budget(client: TestClient) -> None:
    """N1 (issue 50): wrong tokens from the workers' address (sign-in guesses, a user's typo) must not answer the
    workers' checkpoint upload or target download with 429; failures on the worker routes count apart."""
    worker = {"Authorization": "Bearer worker-t"}
    for _ in range(3):
        assert client.get("/jobs", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/jobs", headers={"Authorization": "Bearer user-t"}).status_code == 429  # that budget is spent
    assert client.get("/internal/ping", headers=worker).status_code == 200  # the workers' is not
    for _ in range(3):
        assert client.get("/internal/ping", headers={"Authorization": "Bearer guess"}).status_code == 401
    assert client.get("/internal/ping", headers=worker).status_code == 429  # guesses there are limited too

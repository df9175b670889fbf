"""Failed sign-ins per client address: after ``limit`` failures within ``window`` seconds an address is answered
429 (``Retry-After``: when its oldest failure leaves the window) on every guarded request, right token or not,
until then. The right token is never locked out for longer than the window; a guesser gets ``limit`` tries per
window instead of hundreds per second.

Guarded: any request with an ``Authorization`` header (the JSON API's bearer tokens), and the sign-in posts
(``sign_in_paths``: the console's ``POST /ui/login``); a failure is such a request answered 401. Not the open
paths (health, readiness, metrics). Behind a proxy every client has the proxy's address: then they share one
budget (a guesser there locks the others out for at most one window).

Paths under ``own_budget_prefixes`` (the API's worker routes, ``/internal/``) count and check a budget of their own
(issue 50, N1): wrong tokens sent elsewhere from the workers' address (sign-in guesses, a user's typo on the same
host) never answer a worker's checkpoint upload or target download with 429, and guesses at the worker token
are limited all the same.

A sliding window of failure times per address, bounded (``max_clients`` addresses, the least recent dropped
first), rather than a rate-limiting library such as ``pyrate-limiter``: those limit the rate of all requests,
while here only failures count and the answer needs the time until the next try is allowed.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from t3ar_services.common.status_watch import StatusWatch


class FailureWindow:
    """Failure times per client address within the last ``window`` seconds."""

    def __init__(self, limit: int, window: float, *, max_clients: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.window = window
        self.max_clients = max_clients
        self.clock = clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def _recent(self, client: str, now: float) -> deque[float]:
        times = self._failures.get(client, deque())
        while times and times[0] <= now - self.window:
            times.popleft()
        return times

    def retry_after(self, client: str) -> int | None:
        """Seconds until ``client`` may try again, or None when it may now."""
        now = self.clock()
        with self._lock:
            times = self._recent(client, now)
            if not times:
                self._failures.pop(client, None)
            if len(times) < self.limit:
                return None
            return max(1, math.ceil(times[0] + self.window - now))

    def failed(self, client: str) -> None:
        now = self.clock()
        with self._lock:
            times = self._recent(client, now)
            times.append(now)
            self._failures[client] = times
            self._failures.move_to_end(client)
            while len(self._failures) > self.max_clients:
                self._failures.popitem(last=False)


class AuthFailuresMiddleware:
    """429 for a guarded request from an address over its failure budget (before anything else runs); counts
    the 401s of guarded requests."""

    def __init__(self, app: ASGIApp, *, failures: FailureWindow, sign_in_paths: Iterable[str] = (),
                 open_paths: Iterable[str] = ("/health", "/ready", "/metrics"),
                 own_budget_prefixes: Iterable[str] = ()) -> None:
        self.app = app
        self.failures = failures
        self.own_budget_prefixes = tuple(own_budget_prefixes)
        self.own_budget = FailureWindow(failures.limit, failures.window, max_clients=failures.max_clients,
                                        clock=lambda: failures.clock())  # the same clock, also if replaced
        self.sign_in_paths = frozenset(sign_in_paths)
        self.open_paths = frozenset(open_paths)

    def _guarded(self, scope: Scope) -> bool:
        path = scope.get("path", "")
        if path in self.open_paths:
            return False
        if scope.get("method") == "POST" and path in self.sign_in_paths:
            return True
        return any(name == b"authorization" for name, _ in scope.get("headers") or [])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._guarded(scope):
            await self.app(scope, receive, send)
            return
        client = (scope.get("client") or ("unknown", 0))[0]
        own = self.own_budget_prefixes and scope.get("path", "").startswith(self.own_budget_prefixes)
        failures = self.own_budget if own else self.failures
        wait = failures.retry_after(client)
        if wait is not None:
            await _too_many(send, wait)
            return
        watch = StatusWatch(send, 0)
        try:
            await self.app(scope, receive, watch)
        finally:
            if watch.status == 401:
                failures.failed(client)


async def _too_many(send: Send, wait: int) -> None:
    body = json.dumps({"error": {"code": "too_many_requests", "message": (
        f"too many failed sign-ins from this address: try again in {wait} s")}}).encode()
    await send({"type": "http.response.start", "status": 429, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(wait).encode())]})
    await send({"type": "http.response.body", "body": body})

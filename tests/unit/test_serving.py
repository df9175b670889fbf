"""How the services run in uvicorn (``t3ar_services.common.serving``), over real sockets on 127.0.0.1: forwarded
headers are trusted only from configured proxies (the failed sign-in limit counts the real address), a request's
head must arrive within the header timeout (a client dribbling its headers is cut off), and connections over the
cap are closed."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from console_kit import app_for, new_pool, settings_for
from uvicorn_kit import serving

from t3ar_services.common.serving import uvicorn_options


async def _hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": scope["client"][0].encode()})


def _closed(sock: socket.socket, drip: bytes, every: float = 0.1) -> int | None:
    """Send ``drip`` a byte at a time, ``every`` seconds apart, while the server keeps the connection; the bytes
    sent when it closed it, None when all of them went through and it is still open."""
    sock.settimeout(every)
    for i in range(len(drip)):
        try:
            if sock.recv(1024) == b"":
                return i
        except TimeoutError:
            pass
        except OSError:
            return i
        try:
            sock.sendall(drip[i:i + 1])
        except OSError:
            return i
    return None


def _connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    """A connection from ``source`` (any 127.x.y.z: another peer address on the loopback)."""
    return socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))


def _closed_at_once(socks: list[socket.socket]) -> list[bool]:
    closed = []
    for sock in socks:
        sock.settimeout(0.5)
        try:
            closed.append(sock.recv(1) == b"")
        except TimeoutError:
            closed.append(False)
    return closed


def _served(port: int, source: str) -> bool:
    with _connect(port, source) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        sock.settimeout(5)
        try:
            return sock.recv(1024).startswith(b"HTTP/1.1 200")
        except OSError:
            return False


@pytest.fixture()
def port(tmp_path: Path) -> Iterator[int]:
    settings = settings_for(tmp_path, header_timeout=1.0, keep_alive_timeout=30, max_connections=50,
                            max_connections_per_peer=40)
    with serving(_hello, **uvicorn_options(settings)) as p:
        yield p


def test_a_client_sending_its_headers_a_byte_at_a_time_is_cut_off(port: int) -> None:
    head = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Slow: " + b"a" * 400  # 40 s of dripping at most
    with _connect(port) as sock:
        sent = _closed(sock, head)
    assert sent is not None, "the connection was still open after 40 s of dripped headers (header timeout: 1 s)"
    with _connect(port) as sock:  # a prompt client is served as before
        sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert sock.recv(1024).startswith(b"HTTP/1.1 200")


def test_a_dripping_second_request_on_a_kept_alive_connection_is_cut_off(port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert sock.recv(1024).startswith(b"HTTP/1.1 200")
        sent = _closed(sock, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 400)
    assert sent is not None


def test_connections_over_the_cap_are_closed_as_they_open(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, header_timeout=60.0, max_connections=4, max_connections_per_peer=3)
    with serving(_hello, **uvicorn_options(settings)) as port, ExitStack() as held:
        socks = [held.enter_context(_connect(port, "127.0.0.1")) for _ in range(3)]  # one peer's cap
        socks += [held.enter_context(_connect(port, "127.0.0.2")) for _ in range(5)]  # the global cap
        closed = _closed_at_once(socks)
        assert closed.count(False) == 4 and all(closed[4:]), closed
        for sock in socks[:4]:
            sock.close()
        deadline = time.monotonic() + 30  # the server notices the closed ones
        while True:
            with _connect(port) as sock:
                sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                sock.settimeout(5)
                if sock.recv(1024).startswith(b"HTTP/1.1 200"):
                    break
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_forwarded_for_is_ignored_unless_the_peer_is_a_configured_proxy(tmp_path: Path) -> None:
    """30 wrong tokens, each claiming another X-Forwarded-For address, from one real client: limited after the
    budget, as one address (uvicorn's default trusted the header from 127.0.0.1)."""
    settings = settings_for(tmp_path, auth_failures=3)
    with serving(app_for(settings, new_pool()), **uvicorn_options(settings)) as port:
        codes = [httpx.get(f"http://127.0.0.1:{port}/jobs", timeout=30, headers={
            "Authorization": "Bearer wrong", "X-Forwarded-For": f"10.0.{i}.{i + 1}"}).status_code for i in range(30)]
    assert codes[:3] == [401] * 3 and set(codes[3:]) == {429}, codes


def test_forwarded_for_is_trusted_from_a_configured_proxy() -> None:
    settings = settings_for(Path("/nonexistent"), forwarded_allow_ips="127.0.0.1", header_timeout=5.0)
    with serving(_hello, **uvicorn_options(settings)) as port:
        seen = httpx.get(f"http://127.0.0.1:{port}/", headers={"X-Forwarded-For": "10.1.2.3"}).text
    assert seen == "10.1.2.3"
    untrusted = settings_for(Path("/nonexistent"))
    with serving(_hello, **uvicorn_options(untrusted)) as port:
        seen = httpx.get(f"http://127.0.0.1:{port}/", headers={"X-Forwarded-For": "10.1.2.3"}).text
    assert seen == "127.0.0.1"


def test_one_peer_cannot_hold_every_connection(tmp_path: Path) -> None:
    """N3 (issue 50): one client re-opening connections held all the slots and other clients' health checks did
    not get through; a peer now holds at most MAX_CONNECTIONS_PER_PEER, below the global cap."""
    settings = settings_for(tmp_path, header_timeout=60.0, max_connections=8, max_connections_per_peer=3)
    with serving(_hello, **uvicorn_options(settings)) as port, ExitStack() as held:
        hog = [held.enter_context(_connect(port, "127.0.0.3")) for _ in range(10)]
        closed = _closed_at_once(hog)
        assert closed[:3] == [False] * 3 and all(closed[3:]), closed  # the rest closed as they opened
        assert _served(port, "127.0.0.4")  # another client is served meanwhile
        for sock in hog[:3]:
            sock.close()
        deadline = time.monotonic() + 30  # once the server noticed, the first peer may connect again
        while not _served(port, "127.0.0.3"):
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_a_trusted_proxy_is_not_capped_per_peer(tmp_path: Path) -> None:
    """Every client behind a trusted proxy has its address: the per-peer cap would cap them all together."""
    settings = settings_for(tmp_path, header_timeout=60.0, max_connections=8, max_connections_per_peer=2,
                            forwarded_allow_ips="127.0.0.5/32")
    with serving(_hello, **uvicorn_options(settings)) as port, ExitStack() as held:
        proxy = [held.enter_context(_connect(port, "127.0.0.5")) for _ in range(5)]
        assert _closed_at_once(proxy) == [False] * 5


def test_the_per_peer_cap_must_be_below_the_global_cap(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="MAX_CONNECTIONS_PER_PEER .* must be below"):
        settings_for(tmp_path, max_connections=10, max_connections_per_peer=10)

"""The clients' lean JSON POST (``t3ar.clients.http._LeanPost``) against a real socket server that answers what
each test scripts: one write per request, keep-alive reuse, and None (connection dropped) for everything that is
not a plain 200 with a Content-Length."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from t3ar.clients.http import _LeanPost
from t3ar.logs import REQUEST_ID

CLOSE = b"<close>"  # ends a scripted answer: the server closes the connection after sending it
OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\":true}"


class Server:
    """Accepts connections; per request records (connection number, request bytes) and sends the next answer
    of ``answers`` (``None``: close the connection instead of answering; ending in ``CLOSE``: close after it)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.answers: list[bytes | None] = []
        self.seen: list[tuple[int, bytes]] = []
        self.reads: list[int] = []  # recv calls per request
        self.conns = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns += 1
            threading.Thread(target=self._serve, args=(conn, self.conns), daemon=True).start()

    def _serve(self, conn: socket.socket, n: int) -> None:
        buf = b""
        with conn:
            while True:
                reads = 0
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    reads += 1
                    if not chunk:
                        return
                    buf += chunk
                head, _, rest = buf.partition(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                while len(rest) < length:
                    rest += conn.recv(65536)
                    reads += 1
                self.seen.append((n, head + b"\r\n\r\n" + rest[:length]))
                self.reads.append(reads)
                buf = rest[length:]
                answer = self.answers.pop(0) if self.answers else OK
                if answer is None:
                    return
                conn.sendall(answer.removesuffix(CLOSE))
                if answer.endswith(CLOSE):
                    return


@pytest.fixture()
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.sock.close()


def _lean(server: Server, base: str = "") -> _LeanPost:
    lean = _LeanPost.for_url(f"http://127.0.0.1:{server.port}{base}", {"Authorization": "Bearer tok"}, 10)
    assert lean is not None
    return lean


def test_one_write_per_request_and_keep_alive(server: Server) -> None:
    lean = _lean(server, "/svc")
    token = REQUEST_ID.set("req-1")
    try:
        assert lean.post("/search", b'{"a":1}', REQUEST_ID.get()) == b'{"ok":true}'
    finally:
        REQUEST_ID.reset(token)
    assert lean.post("/search", b'{"b":2}', None) == b'{"ok":true}'
    (c1, r1), (c2, r2) = server.seen
    assert c1 == c2 == 1 and server.conns == 1  # the connection is reused
    head, _, body = r1.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /svc/search HTTP/1.1" and body == b'{"a":1}'
    assert {b"Host: 127.0.0.1:%d" % server.port, b"Authorization: Bearer tok", b"Content-Type: application/json",
            b"Accept: application/json", b"Content-Length: 7", b"X-Request-ID: req-1"} <= set(lines[1:])
    assert b"X-Request-ID" not in r2
    assert server.reads[0] == 1  # head and body arrived together (one sendall)
    lean.close()


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 2\r\n\r\n{}",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 50\r\n\r\n{}",  # cut short
    b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n{}",
    b"garbage\r\n\r\n",
    None,  # dropped without an answer
])
def test_anything_but_a_plain_200_is_none_and_a_new_connection(server: Server, answer: bytes | None) -> None:
    lean = _lean(server)
    server.answers = [answer if answer is None else answer + CLOSE]
    assert lean.post("/x", b"{}", None) is None
    assert lean.post("/x", b"{}", None) == b'{"ok":true}'
    assert server.seen[-1][0] == server.conns == 2


def test_connection_close_answer_is_used_then_reconnects(server: Server) -> None:
    lean = _lean(server)
    server.answers = [OK.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n", 1) + CLOSE]
    assert lean.post("/x", b"{}", None) == b'{"ok":true}'
    assert lean.post("/x", b"{}", None) == b'{"ok":true}'
    assert server.conns == 2


def test_urls_and_headers_it_does_not_take() -> None:
    assert _LeanPost.for_url("https://127.0.0.1:1", {}, 1) is None
    assert _LeanPost.for_url("http://u:p@127.0.0.1:1", {}, 1) is None
    assert _LeanPost.for_url("http://127.0.0.1:1", {"Authorization": "Bearer t\u00e9"}, 1) is None
    assert _LeanPost.for_url("http://127.0.0.1:1", {"Authorization": "Bearer a\r\nX: y"}, 1) is None
    lean = _LeanPost.for_url("http://127.0.0.1:1", {}, 1)
    assert lean is not None and lean.post("/x", b"{}", "bad\r\nid") is None  # httpx then refuses it clearly


def test_a_kept_connection_the_server_closed_is_replaced_once(server: Server) -> None:
    lean = _lean(server)
    server.answers = [OK + CLOSE]  # answers, then closes the kept connection without saying so (idle timeout)
    assert lean.post("/x", b"{}", None) == b'{"ok":true}'
    time.sleep(0.1)
    assert lean.post("/x", b"{}", None) == b'{"ok":true}'  # on a new connection, not through the fallback
    assert server.conns == 2 and len(server.seen) == 2
    server.answers = [None, None]  # a fresh connection that closes without an answer is not tried again
    lean._drop()
    assert lean.post("/x", b"{}", None) is None
    assert server.conns == 3

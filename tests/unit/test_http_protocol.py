"""The services' uvicorn protocol writes a response's head and body at once, and changes no byte of any answer."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from uvicorn_kit import serving

from t3ar_services.common.http_protocol import HOLD_MAX, CoalescingHttpToolsProtocol, CoalescingTransport


class FakeTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str) -> Any:
        return ("1.2.3.4", 5) if name == "peername" else None


def test_transport_joins_a_small_write_with_the_next_and_never_holds_past_the_iteration() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        fake = FakeTransport()
        t = CoalescingTransport(fake, loop)  # type: ignore[arg-type]
        t.write(b"HEAD")
        assert fake.writes == []
        t.write(b"body")
        assert fake.writes == [b"HEADbody"]  # one write
        t.write(b"alone")
        assert fake.writes == [b"HEADbody"]
        await asyncio.sleep(0)  # the end of the loop iteration sends it
        assert fake.writes == [b"HEADbody", b"alone"]
        big = b"x" * (HOLD_MAX + 1)
        t.write(big)  # not held
        assert fake.writes[-1] == big
        t.write(b"h")
        t.close()  # sends what is held first
        assert fake.writes[-1] == b"h" and fake.closed
        assert t.get_extra_info("peername") == ("1.2.3.4", 5)  # everything else is the transport's

    asyncio.run(main())


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        for i in range(3):
            await send({"type": "http.response.body", "body": b"part%d;" % i, "more_body": True})
            await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": b""})
        return
    body = b"y" * 300_000 if scope["path"] == "/big" else b'{"ok":true}'
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode()), (b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


WRITES: list[bytes] = []  # what reached the socket transport, write by write


class _Counting:
    def __init__(self, transport: Any) -> None:
        self._transport = transport

    def write(self, data: bytes) -> None:
        WRITES.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CountingProtocol(CoalescingHttpToolsProtocol):
    def connection_made(self, transport: Any) -> None:
        super().connection_made(_Counting(transport))


@pytest.fixture()
def server() -> Iterator[int]:
    with serving(_app, http=CountingProtocol) as port:
        yield port


def test_real_uvicorn_sends_head_and_body_in_one_segment_and_answers_stay_the_same(server: int) -> None:
    WRITES.clear()
    with socket.create_connection(("127.0.0.1", server)) as sock:
        for _ in range(3):  # keep-alive
            sock.sendall(b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n")
            data = b""
            while not data.endswith(b"}"):
                data += sock.recv(65536)
            assert data.startswith(b"HTTP/1.1 200 OK\r\n") and data.endswith(b'\r\n\r\n{"ok":true}'), data
            assert WRITES[-1] == data  # head and body in one socket write
    assert len(WRITES) == 3
    with httpx.Client(base_url=f"http://127.0.0.1:{server}") as client:
        assert client.get("/x").json() == {"ok": True}
        assert client.get("/big").content == b"y" * 300_000
        assert client.post("/x", content=b"z" * 100_000).json() == {"ok": True}
        with client.stream("GET", "/stream") as resp:
            assert b"".join(resp.iter_bytes()) == b"part0;part1;part2;"
            assert resp.headers["transfer-encoding"] == "chunked"

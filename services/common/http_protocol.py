"""uvicorn's httptools protocol, writing a response's head and its body to the socket at once.

uvicorn writes the status line and headers when the app sends ``http.response.start`` and the body with
``http.response.body``: two socket writes, two TCP segments on a keep-alive connection. The first one wakes
the client, which reads the head and sleeps again until the second arrives; on a busy machine the woken
client also takes the server's core between the two. Measured on the 2-core development machine (py-spy, single
searches on a 1,000-vector pool): the head's write was a quarter of the retriever's sampled time per request.

:class:`CoalescingHttpToolsProtocol` gives uvicorn's protocol a transport that holds a small write until the
next write or the end of the current event-loop iteration, whichever comes first, and sends a held write and
the next one in a single call. A response whose body follows its head in the same loop iteration (every
non-streamed response) leaves in one segment; nothing is ever delayed past the iteration that wrote it, and
the order of bytes is unchanged. ``uvicorn.Config(http=CoalescingHttpToolsProtocol)``; without httptools the
services run on uvicorn's default protocol.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HOLD_MAX = 16 * 1024  # a write this small is held (a response head is a few hundred bytes)
JOIN_MAX = 256 * 1024  # a held write is sent together with a next write up to this size, else before it


class CoalescingTransport:
    """A transport that sends a small write together with the next one (see the module); everything else is
    the wrapped transport's."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if len(data) <= JOIN_MAX:
                self._transport.write(held + bytes(data))
                return
            self._transport.write(held)
        elif len(data) <= HOLD_MAX and not self._transport.is_closing():
            self._held = bytes(data)
            self._loop.call_soon(self.flush)
            return
        self._transport.write(data)

    def flush(self) -> None:
        """Send a held write now."""
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held)

    def writelines(self, chunks: Any) -> None:
        self.flush()
        self._transport.writelines(chunks)

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:  # get_extra_info, is_closing, pause_reading, ...
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]

"""A real uvicorn server on a free 127.0.0.1 port, in a thread of the test process (for what only real HTTP
shows: keep-alive, socket writes)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


@contextmanager
def serving(app: Any, **config: Any) -> Iterator[int]:
    """``app`` served until the block ends; yields the port. ``config``: more ``uvicorn.Config`` options."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off",
                                        **config))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not srv.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield port
    finally:
        srv.should_exit = True
        thread.join(10)

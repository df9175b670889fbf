"""Local TCP ports for child processes that bind them later: never one the kernel could hand out meanwhile."""

from __future__ import annotations

import secrets
import socket
from pathlib import Path

EPHEMERAL_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_handed_out: set[int] = set()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for ports chosen by ``bind(0)`` and outgoing connections (Linux; else its default)."""
    try:
        lo, hi = (int(x) for x in EPHEMERAL_FILE.read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A port free on 127.0.0.1 now, for a child process to bind later, chosen *below* the ephemeral range.

    A port taken with ``bind(0)`` and released is in the ephemeral range, so anything that binds port 0 before
    the child binds ours may be given the same one: the retriever's milvus-lite starts its in-process gRPC
    server on port 0 during start-up, before uvicorn binds, and took the retriever's port that way in a CI run
    ("address already in use"). Below the range the kernel never hands a port out by itself. Never the same
    port twice in one process. Falls back to ``bind(0)`` when the range leaves no room below it."""
    lo, _ = ephemeral_range()
    first = max(1024, lo - 12_000)
    rng = secrets.SystemRandom()
    tries = 64 if lo - first >= 1000 else 0
    for _ in range(tries):
        port = rng.randrange(first, lo)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    _handed_out.add(port)
    return port

"""Local TCP ports for child processes that bind them later: never one the kernel could hand out meanwhile."""

from __future__ import annotations

import os
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


#: the ports :func:`free_port` picks from, "LO-HI" (LO included, HI not): processes that pick ports side by side on
#: one machine (the test command's two pytest lanes) take disjoint ranges, so that neither picks one the other holds
RANGE_ENV = "T3AR_FREE_PORT_RANGE"
#: how many ports below the ephemeral range :func:`free_port` picks from by default
BELOW_EPHEMERAL = 12_000


def port_range() -> tuple[int, int]:
    """[first, stop): where :func:`free_port` looks. ``$T3AR_FREE_PORT_RANGE`` ("LO-HI", 1024 <= LO < HI <= 65536)
    where set, else the ``BELOW_EPHEMERAL`` ports just below the kernel's ephemeral range (from 1024 at the least).
    A malformed value is a ValueError that names the variable."""
    raw = os.environ.get(RANGE_ENV, "").strip()
    if not raw:
        lo, _ = ephemeral_range()
        return max(1024, lo - BELOW_EPHEMERAL), lo
    try:
        first, stop = (int(x) for x in raw.split("-"))
    except ValueError:
        raise ValueError(f"{RANGE_ENV}={raw!r}: expected LO-HI, two port numbers (LO included, HI not)") from None
    if not 1024 <= first < stop <= 65536:
        raise ValueError(f"{RANGE_ENV}={raw!r}: expected 1024 <= LO < HI <= 65536")
    return first, stop


def free_port() -> int:
    """A port free on 127.0.0.1 now, for a child process to bind later, chosen from :func:`port_range`: by default
    *below* the ephemeral range.

    A port taken with ``bind(0)`` and released is in the ephemeral range, so anything that binds port 0 before
    the child binds ours may be given the same one: the retriever's milvus-lite starts its in-process gRPC
    server on port 0 during start-up, before uvicorn binds, and took the retriever's port that way in a CI run
    ("address already in use"). Below the range the kernel never hands a port out by itself. Never the same
    port twice in one process. Falls back to ``bind(0)`` when 64 tries found none free in the range, or at once
    when the default range leaves no room below the ephemeral one (under 1000 ports)."""
    first, stop = port_range()
    rng = secrets.SystemRandom()
    tries = 64 if stop - first >= 1000 or os.environ.get(RANGE_ENV, "").strip() else 0
    for _ in range(tries):
        port = rng.randrange(first, stop)
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

"""How the services run in uvicorn: which forwarded headers they trust, how long a request's head may take, how
many connections they hold (the settings every service shares, :class:`t3ar_services.common.settings.ServiceSettings`).

- Forwarded headers (``X-Forwarded-For``, ``X-Forwarded-Proto``) are trusted only from the addresses in
  ``FORWARDED_ALLOW_IPS`` (a service's setting; unset: from nobody). uvicorn's own default trusts them from
  127.0.0.1, so any local client (or a proxy that passes a client's header through) chose the address the
  failed sign-in limit counts by.
- A request's head must arrive within ``HEADER_TIMEOUT`` seconds (:class:`ConnectionGuard`), an idle kept-alive
  connection is closed after ``KEEP_ALIVE_TIMEOUT``, and at most ``MAX_CONNECTIONS`` are open: one over it is
  closed as it opens, and a request on a full server is answered 503 (uvicorn's ``limit_concurrency``).
- One peer address holds at most ``MAX_CONNECTIONS_PER_PEER`` of them (issue 50, N3: one client re-opening
  connections held all 1,000 slots, and 2 of 125 health checks got through in 30 s); one more from it is closed as
  it opens. A trusted proxy (``FORWARDED_ALLOW_IPS``), whose address every client behind it shares, is not capped
  per peer.
"""

from __future__ import annotations

import asyncio
import importlib.util
import ipaddress
from collections import Counter
from collections.abc import Callable
from typing import Any

from t3ar_services.common.settings import ServiceSettings


class ConnectionGuard:
    """A mixin for a uvicorn HTTP protocol class: a request's head (request line and headers) must arrive within
    ``header_timeout`` seconds of the connection opening, or of the previous response on a kept-alive one, else
    the connection is closed (uvicorn has no such timeout: a client sending its headers a byte at a time held
    the connection, and one file descriptor, forever); and a connection over ``max_connections`` open ones is
    closed as it opens. Both are set by :func:`guarded`; the request body is the routes' business (their body
    limits)."""

    header_timeout: float = 10.0
    max_connections: int = 1000
    max_per_peer: int = 1000
    per_peer: Counter[str]  # open connections per peer address (one Counter per guarded class: per server)
    uncapped: Callable[[str], bool] = staticmethod(lambda _peer: False)
    _header_timer: asyncio.TimerHandle | None = None
    _peer: str | None = None  # counted in per_peer while open
    # uvicorn's protocol's own (the class this is mixed into)
    cycle: Any
    connections: Any
    loop: asyncio.AbstractEventLoop
    transport: Any

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        if len(self.connections) > self.max_connections:
            transport.close()
            return
        peername = transport.get_extra_info("peername")
        peer = str(peername[0]) if isinstance(peername, tuple) and peername else ""
        if peer and not self.uncapped(peer):
            if self.per_peer[peer] >= self.max_per_peer:
                transport.close()
                return
            self.per_peer[peer] += 1
            self._peer = peer
        self._arm()

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        if self._header_timer is None and (cycle is None or cycle.response_complete):
            self._arm()  # the first bytes of a next request on a kept-alive connection
        super().data_received(data)  # type: ignore[misc]
        if self.cycle is not cycle:  # a request's head is complete
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._peer is not None:
            self.per_peer[self._peer] -= 1
            if self.per_peer[self._peer] <= 0:
                del self.per_peer[self._peer]
            self._peer = None
        super().connection_lost(exc)  # type: ignore[misc]

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout, self._too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _too_slow(self) -> None:
        self._header_timer = None
        transport = self.transport
        if not transport.is_closing():
            transport.close()


def guarded(base: type, header_timeout: float, max_connections: int, max_per_peer: int | None = None,
            trusted: str | None = None) -> type:
    """``base`` (a uvicorn HTTP protocol class) with :class:`ConnectionGuard`'s header timeout and connection caps
    (``max_per_peer`` None: the global cap; ``trusted``: the proxies' addresses, not capped per peer)."""
    return type(f"Guarded{base.__name__}", (ConnectionGuard, base),
                {"header_timeout": header_timeout, "max_connections": max_connections,
                 "max_per_peer": min(max_per_peer or max_connections, max_connections), "per_peer": Counter(),
                 "uncapped": staticmethod(_matcher(trusted))})


def _matcher(trusted: str | None) -> Callable[[str], bool]:
    """Whether a peer address is one of ``trusted`` (comma-separated addresses or networks; ``*``: any)."""
    entries = [t.strip() for t in (trusted or "").split(",") if t.strip()]
    if "*" in entries:
        return lambda _peer: True
    nets: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    for entry in entries:
        try:
            nets.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:  # a host name or a unix socket path: compared as written
            pass

    def match(peer: str) -> bool:
        try:
            addr = ipaddress.ip_address(peer)
        except ValueError:
            return peer in entries
        return peer in entries or any(addr in n for n in nets)

    return match



def protocol_class(settings: ServiceSettings) -> type:
    """The HTTP protocol the services run on: uvicorn's httptools one when httptools is installed (its h11 one
    otherwise), guarded."""
    if importlib.util.find_spec("httptools") is not None:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        base: type = HttpToolsProtocol
    else:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        base = H11Protocol
    return guarded(base, settings.header_timeout, settings.max_connections, settings.max_connections_per_peer,
                   settings.forwarded_allow_ips)


def uvicorn_options(settings: ServiceSettings) -> dict[str, Any]:
    """The ``uvicorn.Config`` options of the module's rules for a service with ``settings``."""
    trusted = settings.forwarded_allow_ips
    return {"http": protocol_class(settings), "proxy_headers": bool(trusted), "forwarded_allow_ips": trusted or None,
            "timeout_keep_alive": settings.keep_alive_timeout, "limit_concurrency": settings.max_connections}

"""The request-body limit of both services: 413 in the JSON error envelope.

Refused up front from a declared Content-Length, or cut off while streaming (chunked uploads), whatever the
route would have answered. (Not FastAPI's ``max_body_size``: that one answers a declared Content-Length over
the limit in plain text.) A route may have a tighter limit of its own (``limit_for``: e.g. the retriever's
``POST /search``, bounded by what a search of the pool can use), refused the same way before it is read; the
API gives every route one (:class:`RouteLimits`: a route marks what its body is with :func:`body_size`, and
unmarked routes, which take a few fields, get a small default).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import Depends
from fastapi.routing import APIRoute
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: ``limit_for(scope)``: a route's own (limit, hint), or None for the service's
LimitFor = Callable[[Scope], tuple[int, str] | None]


class BodyLimitMiddleware:
    """413 ``payload_too_large`` for a body over ``limit`` bytes; ``hint`` ends the message (which setting
    bounds what, what to send instead)."""

    def __init__(self, app: ASGIApp, limit: int, hint: str, limit_for: LimitFor | None = None) -> None:
        self.app = app
        self.limit = limit
        self.hint = hint
        self.limit_for = limit_for

    async def _reject(self, send: Send, limit: int, hint: str) -> None:
        body = json.dumps({"error": {"code": "payload_too_large",
                                     "message": f"request body larger than {limit} bytes{hint}"}}).encode()
        await send({"type": "http.response.start", "status": 413, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, hint = (self.limit_for(scope) if self.limit_for is not None else None) or (self.limit, self.hint)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._reject(send, limit, hint)
            return
        seen = 0
        exceeded = False

        async def limited_receive() -> Message:
            nonlocal seen, exceeded
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    exceeded = True
                    raise _TooLarge()
            return message

        async def guarded_send(message: Message) -> None:
            if exceeded:  # the app answered an aborted body read (e.g. 400): replace it with our 413
                if message["type"] == "http.response.start":
                    await self._reject(send, limit, hint)
                return
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except _TooLarge:
            await self._reject(send, limit, hint)


class _TooLarge(Exception):
    pass


def body_size(kind: str) -> Any:
    """A route dependency that marks the route's body as ``kind`` (a key of the service's :class:`RouteLimits`
    table, e.g. ``"archive"``); unmarked routes get the table's default. It does nothing when called: the body
    limit middleware reads the mark, before the body is read."""

    def body_limit_mark() -> None:
        return None

    body_limit_mark.t3ar_body = kind  # type: ignore[attr-defined]
    return Depends(body_limit_mark)


class RouteLimits:
    """``limit_for`` of an app whose routes mark their bodies (:func:`body_size`): the (limit, hint) of the route a
    request matches, else ``default`` (a route without a mark, or no route at all). The routes are read on first
    use (all are included by then: the middleware stack is built on the first request); :meth:`attach` names the
    app once it exists."""

    def __init__(self, limits: Mapping[str, tuple[int, str]], default: tuple[int, str]) -> None:
        self.app: Any = None
        self.limits = dict(limits)
        self.default = default
        self._table: list[tuple[APIRoute, tuple[int, str]]] | None = None

    def attach(self, app: Any) -> None:
        self.app = app

    def _fill(self) -> list[tuple[APIRoute, tuple[int, str]]]:
        table = []
        for route in _api_routes(self.app.routes):
            limit = self.default
            stack = list(route.dependant.dependencies)
            while stack:
                dep = stack.pop()
                kind = getattr(dep.call, "t3ar_body", None)
                if kind is not None:
                    limit = self.limits[kind]  # KeyError at the first request: a mark with no limit
                    break
                stack.extend(dep.dependencies)
            table.append((route, limit))
        return table

    def __call__(self, scope: Scope) -> tuple[int, str]:
        if self._table is None:
            self._table = self._fill()
        partial = None
        for route, limit in self._table:
            match = route.matches(scope)[0]
            if match == Match.FULL:
                return limit
            if match == Match.PARTIAL and partial is None:
                partial = limit  # the path, another method: the router answers 405 unread, not our 413
        return partial or self.default


def _api_routes(routes: list[Any]) -> list[APIRoute]:
    """The app's API routes, also those of included routers (FastAPI >= 0.165 keeps an included router as one
    entry of ``app.routes``; its routes, prefix included, stay on the router)."""
    found: list[APIRoute] = []
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            found += _api_routes(inner.routes)
        elif isinstance(route, APIRoute):
            found.append(route)
    return found

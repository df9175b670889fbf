"""One hot JSON route answered at the outermost middleware layer, with the stack's behaviour done inline.

Every request passes the service's middleware stack (request id + access log, metrics, credentials first, body
limit: :mod:`t3ar_services.common.app`), four ASGI layers with a closure, a header scan and an await each. For
the one route a service is judged on per call (the retriever's ``POST /search``) that cost more CPU than the
search of a small pool, so this layer, the outermost of the stack, takes a request for that method and path
whose headers it fully understands and does the same things once, inline:

- credentials: one known bearer token (or auth disabled), else the request goes down the stack (401 there;
  400 for a repeated ``Authorization`` header);
- body limit: a declared ``Content-Length`` within the limit, else down the stack (413 there; chunked too);
- request id: the client's sane ``X-Request-ID`` or a new one, current while the answer is made
  (:data:`t3ar.logs.REQUEST_ID`), returned in the response header and ending the access-log line;
- metrics: the request-latency histogram, labelled with the route template like the metrics middleware.

The body is read here and given to ``answer(body) -> bytes | None``: bytes are sent as the 200
``application/json`` answer; None (a body the lean code does not handle, or any failure) sends the request down
the whole stack with its body replayed, so answers and errors are exactly the route's.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from t3ar.logs import REQUEST_ID, request_id_from
from t3ar_services.common.body_limit import LimitFor
from t3ar_services.common.credentials import bearer_problem
from t3ar_services.common.metrics import ServiceMetrics
from t3ar_services.common.request_id import HEADER_NAME, log_access

Answer = Callable[[bytes], Awaitable[bytes | None]]


class FastLane:
    """``method path`` (an exact path, also the metrics label) answered by ``answer``; see the module."""

    def __init__(self, app: ASGIApp, *, method: str, path: str, answer: Answer, metrics: ServiceMetrics,
                 body_limit: int, accepts: Callable[[str], bool], auth_enabled: bool,
                 limit_for: LimitFor | None = None) -> None:
        self.app = app
        self.limit_for = limit_for
        self.method, self.path, self.answer = method, path, answer
        self.metrics = metrics
        self.body_limit = body_limit
        self.accepts = accepts
        self.auth_enabled = auth_enabled
        self._observe: Callable[[float], None] | None = None  # the 200 series, made on first use like labels()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != self.path or scope["method"] != self.method:
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        ctype = length = auth = given = None
        repeated = False
        for name, value in scope["headers"]:  # the last of repeated headers wins, as in the stack's dict()s
            if name == b"content-type":
                ctype = value
            elif name == b"content-length":
                length = value
            elif name == b"authorization":
                repeated = auth is not None  # one rule for both paths: the stack refuses a repeated header
                auth = value
            elif name == HEADER_NAME:
                given = value
            elif name == b"transfer-encoding":
                length = None
                break
        limit = self.body_limit
        if self.limit_for is not None and (own := self.limit_for(scope)) is not None:
            limit = own[0]
        if ctype is None or ctype.split(b";", 1)[0].strip().lower() != b"application/json" or length is None \
                or not length.isdigit() or int(length) > limit \
                or (self.auth_enabled and (repeated or bearer_problem(auth, self.accepts) is not None)):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # disconnected: let the stack see it
                await self.app(scope, _replay(b"".join(chunks), receive, message), send)
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        rid = request_id_from(given.decode("latin-1") if given is not None else None)
        token = REQUEST_ID.set(rid)
        try:
            answer = await self.answer(raw)
        finally:
            REQUEST_ID.reset(token)
        if answer is None:
            await self.app(scope, _replay(raw, receive), send)
            return
        token = REQUEST_ID.set(rid)  # again for the access-log line
        status = 500  # unless the response starts
        try:
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-length", str(len(answer)).encode()), (b"content-type", b"application/json"),
                (HEADER_NAME, rid.encode())]})
            status = 200
            await send({"type": "http.response.body", "body": answer})
        finally:
            elapsed = time.perf_counter() - t0
            if status == 200:
                if self._observe is None:
                    self._observe = self.metrics.request_seconds.labels(self.method, self.path, "200").observe
                self._observe(elapsed)
            else:
                self.metrics.request_seconds.labels(self.method, self.path, str(status)).observe(elapsed)
            log_access(self.method, self.path, status, elapsed)
            REQUEST_ID.reset(token)


def _replay(body: bytes, receive: Receive, then: Message | None = None) -> Receive:
    """``receive`` that first hands out the body already read (then ``then``, if given, else the real one)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return then if then is not None else await receive()

    return replayed

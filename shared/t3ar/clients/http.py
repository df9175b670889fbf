"""The base of the services' HTTP clients: connection, bearer token, retries with back-off, error mapping.

Retries: connection failures before the request was sent and 503 are retried for every call; read/write
timeouts, dropped connections and 502/504 only for calls the caller marks ``safe`` to repeat. Exponential
back-off with jitter, honouring ``Retry-After`` (at most 30 s). The request id of the request being served
(:data:`t3ar.logs.REQUEST_ID`), if any, is sent along in ``X-Request-ID``. An error answer becomes the
exception :meth:`HttpClient._error` makes of it; no answer at all becomes ``unavailable_error``.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import os
import random
import socket
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Self

import httpx
import orjson

from t3ar.errors import T3arError
from t3ar.logs import HEADER, REQUEST_ID

log = logging.getLogger(__name__)

_ALWAYS_RETRY = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
_RETRY_IF_SAFE = (httpx.ReadTimeout, httpx.WriteTimeout, httpx.ReadError, httpx.WriteError,
                  httpx.RemoteProtocolError)


class HttpClient:
    """Subclasses set the class attributes and :meth:`_error`, and add the service's calls."""

    service: ClassVar[str]  # names the service in "<service> at <url> unreachable"
    start_hint: ClassVar[str]  # ends that message: how to start the service
    prefix: ClassVar[str] = ""  # starts the message of a transport error that is not a connection failure
    default_timeout: ClassVar[float] = 60.0
    retry_statuses: ClassVar[frozenset[int]] = frozenset({503})  # answers retried for every call (with Retry-After)
    unavailable_error: ClassVar[type[T3arError]]

    def __init__(self, url: str, token: str | None = None, *, timeout: float | None = None, retries: int = 4,
                 backoff: float = 0.25, transport: httpx.BaseTransport | None = None) -> None:
        timeout = self.default_timeout if timeout is None else timeout
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.retries = retries
        self.backoff = backoff
        self._http = httpx.Client(base_url=self.url, headers=headers, transport=transport,
                                  timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)))
        self._lean = _LeanPost.for_url(self.url, headers, timeout) if transport is None else None

    _timeout: httpx.Timeout | None = None  # set on a bounded() copy: every request's own timeout

    def bounded(self, timeout: float) -> Self:
        """This client for a caller that must answer quickly (a web page): the same connections, credentials and
        transport, but each request gives up after ``timeout`` seconds and is not retried. The copy shares the
        original's connections: close the original, not the copy."""
        other = copy.copy(self)
        other.retries = 0
        other._timeout = httpx.Timeout(timeout, connect=min(timeout, 10.0))
        other._lean = None  # the lean path has its own, fixed timeout
        return other

    def close(self) -> None:
        self._http.close()
        if self._lean is not None:
            self._lean.close()

    def _post_json_fast(self, path: str, body: dict[str, Any]) -> Any:
        """POST a JSON body and return the parsed 200 answer, through a plain keep-alive connection when that
        is possible (:class:`_LeanPost`, a small fraction of httpx's CPU per request: this is the hot path of
        searches); any other outcome (an error status, a dropped connection, https, a proxy, a test
        transport) goes through the regular :meth:`_request`, with its retries and error mapping. Only for
        calls that are safe to repeat."""
        payload = orjson.dumps(body)  # a fifth of json.dumps' time for a batch's 700 kB base64 string
        if self._lean is not None:
            answer = self._lean.post(path, payload, REQUEST_ID.get())
            if answer is not None:
                return orjson.loads(answer)  # 256 x 50 ids and scores: 4.0 -> 1.6 ms against json.loads
        return self._request("POST", path, safe=True, content=payload,
                             headers={"Content-Type": "application/json"}).json()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _error(self, resp: httpx.Response, what: str) -> T3arError:
        """The exception for an HTTP error answer (``what`` names the call, e.g. ``POST /search``)."""
        raise NotImplementedError

    def _request(self, method: str, path: str, *, safe: bool, ok_404_on_retry: bool = False,
                 **kwargs: Any) -> httpx.Response:
        """``ok_404_on_retry``: a 404 after a retry is the answer (a delete whose first attempt succeeded)."""
        what = f"{method} {path}"
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            rid = REQUEST_ID.get()
            if rid is not None:  # the request this call serves, for the service's logs
                kwargs["headers"] = {**kwargs.get("headers", {}), HEADER: rid}
            try:
                for f in kwargs.get("files") or []:  # rewind file uploads for a retry
                    if hasattr(f[1][1], "seek"):
                        f[1][1].seek(0)
                if hasattr(kwargs.get("content"), "seek"):  # a streamed file body, likewise
                    kwargs["content"].seek(0)
                if self._timeout is not None:
                    kwargs["timeout"] = self._timeout
                resp = self._http.request(method, path, **kwargs)
            except _ALWAYS_RETRY + _RETRY_IF_SAFE as e:
                if last or (isinstance(e, _RETRY_IF_SAFE) and not safe):
                    raise self.unavailable_error(f"{self.service} at {self.url} unreachable ({what}): "
                                                 f"{type(e).__name__}: {e}; {self.start_hint}") from e
                self._sleep(attempt, None, what, type(e).__name__)
                continue
            except httpx.HTTPError as e:
                raise self.unavailable_error(f"{self.prefix}{what}: {type(e).__name__}: {e}") from e
            if resp.status_code == 404 and attempt > 0 and ok_404_on_retry:
                return resp
            transient = resp.status_code in self.retry_statuses or (safe and resp.status_code in (502, 504))
            if transient and not last:
                self._sleep(attempt, resp.headers.get("retry-after"), what, f"HTTP {resp.status_code}")
                continue
            if resp.status_code >= 400:
                raise self._error(resp, what)
            return resp
        raise AssertionError("unreachable")

    def _sleep(self, attempt: int, retry_after: str | None, what: str, why: str) -> None:
        delay = self.backoff * (2 ** attempt) * (0.5 + random.random())
        if retry_after and retry_after.isdigit():
            delay = max(delay, min(float(retry_after), 30.0))
        log.debug("retrying %s after %s in %.2fs", what, why, delay)
        time.sleep(delay)

    def _json(self, method: str, path: str, *, safe: bool = True, **kwargs: Any) -> Any:
        return self._request(method, path, safe=safe, **kwargs).json()

    def _download(self, path: str, dest: Path, what: str,
                  check: Callable[[int, str], None] | None = None) -> tuple[int, str]:
        """Stream ``GET path`` into a temp file beside ``dest``, hashing as it goes, and rename it over ``dest``
        (all or nothing); ``check(size, sha256)`` may raise first to discard it. The size and sha256. One
        attempt: a transport error propagates (the caller decides whether to start again)."""
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
        h, size = hashlib.sha256(), 0
        try:
            with os.fdopen(fd, "wb") as out, self._http.stream("GET", path) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    raise self._error(resp, what)
                for chunk in resp.iter_bytes(1 << 20):
                    h.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
            if check is not None:
                check(size, h.hexdigest())
            os.replace(tmp, dest)
            return size, h.hexdigest()
        finally:
            Path(tmp).unlink(missing_ok=True)


class _LeanPost:
    """One keep-alive connection per thread to an ``http://`` service without proxies, speaking just enough
    HTTP/1.1 for a JSON POST answered with a ``Content-Length`` body: the request (head and body) leaves in one
    ``sendall`` (one TCP segment, one wake-up of the server), and the answer's head is split by hand.
    ``http.client`` sent the head and the body in two writes and parsed the answer's head with the ``email``
    package: about 0.2 ms of CPU more per call on the development machine. Anything else (another status, a
    chunked or unterminated answer, a dropped connection) returns None and closes the connection."""

    MAX_HEAD = 64 * 1024  # bytes of an answer's status line and headers

    def __init__(self, host: str, port: int, base: str, headers: dict[str, str], timeout: float) -> None:
        self.host, self.port, self.base, self.timeout = host, port, base, timeout
        hdrs = {"Host": host if port == 80 else f"{host}:{port}", **headers, "Content-Type": "application/json",
                "Accept": "application/json"}
        self._head = "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()).encode("latin-1")
        self._local = threading.local()
        self._all: list[tuple[socket.socket, Any]] = []
        self._lock = threading.Lock()

    @classmethod
    def for_url(cls, url: str, headers: dict[str, str], timeout: float) -> _LeanPost | None:
        parts = urllib.parse.urlsplit(url)
        proxied = any(os.environ.get(v) for v in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"))
        if parts.scheme != "http" or not parts.hostname or proxied or parts.username or parts.query:
            return None
        text = "".join([parts.path, *headers.values()])
        if not text.isascii() or not text.isprintable():  # httpx then says what is wrong with them
            return None
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        return cls(host, parts.port or 80, parts.path.rstrip("/"), headers, timeout)

    def _conn(self) -> tuple[socket.socket, Any]:
        conn: tuple[socket.socket, Any] | None = getattr(self._local, "conn", None)
        if conn is None:
            sock = socket.create_connection((self.host.strip("[]"), self.port), timeout=self.timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = (sock, sock.makefile("rb"))
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn[1].close()
            conn[0].close()
            with self._lock:
                if conn in self._all:
                    self._all.remove(conn)

    def post(self, path: str, payload: bytes, request_id: str | None) -> bytes | None:
        """The body of a 200 answer, or None (any other status, or no answer: the caller takes the regular
        path, which repeats the call with retries and maps the error). A kept connection that the server has
        closed meanwhile (not one byte of an answer) is replaced once at once: only for calls safe to repeat."""
        rid = b""
        if request_id is not None:
            if not request_id.isascii() or not request_id.isprintable():
                return None
            rid = f"{HEADER}: {request_id}\r\n".encode()
        request = b"".join([b"POST ", (self.base + path).encode("ascii"), b" HTTP/1.1\r\n", self._head, rid,
                            b"Content-Length: %d\r\n\r\n" % len(payload), payload])
        for attempt in (0, 1):
            reused = getattr(self._local, "conn", None) is not None
            try:
                sock, rfile = self._conn()
                sock.sendall(request)
                answer = self._read(rfile)
            except (_Closed, ConnectionResetError, BrokenPipeError):
                answer = None
                if reused and attempt == 0:  # the server closed the idle connection (keep-alive timeout)
                    self._drop()
                    continue
            except (OSError, ValueError):
                answer = None
            break
        if answer is None:
            self._drop()  # reconnects on the next use
            return None
        body, keep = answer
        if not keep:
            self._drop()
        return body

    def _read(self, rfile: Any) -> tuple[bytes, bool] | None:
        """(body, keep-alive) of a 200 answer with a Content-Length, else None."""
        line = rfile.readline(self.MAX_HEAD + 1)
        if not line:
            raise _Closed
        status = line.split(None, 2)
        if len(status) < 2 or not status[0].startswith(b"HTTP/1.") or status[1] != b"200":
            return None
        length, keep, budget = None, status[0] == b"HTTP/1.1", self.MAX_HEAD
        while True:
            line = rfile.readline(budget + 1)
            budget -= len(line)
            if not line.endswith(b"\n") or budget < 0:
                return None
            if line in (b"\r\n", b"\n"):
                break
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                return None
            elif name == b"connection":
                tokens = {t.strip().lower() for t in value.split(b",")}
                keep = b"close" not in tokens and (keep or b"keep-alive" in tokens)
        if length is None or length < 0:
            return None
        body = rfile.read(length)
        return (body, keep) if len(body) == length else None

    def close(self) -> None:
        with self._lock:
            for sock, rfile in self._all:
                rfile.close()
                sock.close()
            self._all.clear()


class _Closed(Exception):
    """The connection ended before any byte of an answer."""

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
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

import httpx
import orjson
from pydantic import BaseModel, ValidationError

from t3ar.errors import T3arError
from t3ar.logs import HEADER, REQUEST_ID

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)

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

    _timeout: httpx.Timeout | None = None  # set on a bounded() copy: every request's own timeout

    def bounded(self, timeout: float) -> Self:
        """This client for a caller that must answer quickly (a web page): the same connections, credentials and
        transport, but each request gives up after ``timeout`` seconds and is not retried. The copy shares the
        original's connections: close the original, not the copy."""
        other = copy.copy(self)
        other.retries = 0
        other._timeout = httpx.Timeout(timeout, connect=min(timeout, 10.0))
        return other

    def close(self) -> None:
        self._http.close()

    def _post_json(self, model: type[M], path: str, body: dict[str, Any]) -> M:
        """POST a JSON body (encoded by orjson: a fifth of json.dumps' time for a batch's 700 kB base64 string)
        and return the answer as ``model`` (parsed by pydantic's own JSON parser). Only for calls that are safe
        to repeat."""
        resp = self._request("POST", path, safe=True, content=orjson.dumps(body),
                             headers={"Content-Type": "application/json"})
        return self._fit(model, resp.content, f"POST {path}")

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

    def _answer(self, model: type[M], method: str, path: str, *, safe: bool = True, **kwargs: Any) -> M:
        """The answer to a call as ``model`` (the service's answer model, shared with the library)."""
        return self._fit(model, self._request(method, path, safe=safe, **kwargs).content, f"{method} {path}")

    def _fit(self, model: type[M], content: bytes, what: str) -> M:
        """An answer's JSON as ``model``; one that does not fit is ``unavailable_error`` (a service of another
        version than its client), never a traceback."""
        try:
            return model.model_validate_json(content)
        except ValidationError as e:
            err = e.errors()[0]
            raise self.unavailable_error(f"{self.prefix}{what}: the answer does not fit {model.__name__} (is the "
                                         f"client of another version than the {self.service}?): {err['msg']} at "
                                         f"{'.'.join(map(str, err['loc']))}") from None

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

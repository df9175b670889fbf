"""Logging for every t3ar process: one format switch (text or JSON lines) and a request id in every line.

The request id is a context variable: the services set it per request (accepted from ``X-Request-ID`` or
made), the API hands it to the worker in the job, the worker sets it for the job, and the retriever client
sends it on every call, so one id follows a request from the API through the worker to the retriever.

Environment: ``T3AR_LOG_FORMAT`` = ``text`` (default) or ``json``; ``T3AR_ACCESS_LOG`` = ``false`` silences the
services' one-line-per-request access log (logger ``t3ar.access``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from contextvars import ContextVar
from typing import Any

REQUEST_ID: ContextVar[str | None] = ContextVar("t3ar_request_id", default=None)
HEADER = "X-Request-ID"
FORMATS = ("text", "json")
_VALID_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_TEXT = "%(asctime)s %(levelname)-7s %(name)s [%(request_id)s]: %(message)s"


def request_id_from(given: str | None) -> str:
    """``given`` when it is a sane id (1-128 of ``A-Za-z0-9._:-``), else a new random one."""
    return given if given is not None and _VALID_ID.match(given) else uuid.uuid4().hex


class RequestIdFilter(logging.Filter):
    """Puts the current request id (or ``-``) on every record as ``record.request_id``."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get() or "-"
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC ISO 8601), level, logger, message, request_id, pid (+ exc)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname, "logger": record.name, "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None) or REQUEST_ID.get() or "-", "pid": record.process}
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def log_format(value: str | None = None) -> str:
    """The chosen format: ``value``, else ``T3AR_LOG_FORMAT``, else text. Raises ValueError for others."""
    fmt = (value or os.environ.get("T3AR_LOG_FORMAT") or "text").strip().lower()
    if fmt not in FORMATS:
        raise ValueError(f"T3AR_LOG_FORMAT must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return fmt


def configure_logging(level: str, fmt: str | None = None) -> None:
    """Root logging for this process: ``level``, text or JSON lines (:func:`log_format`), request ids."""
    handler = logging.StreamHandler()
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter() if log_format(fmt) == "json" else logging.Formatter(_TEXT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is too chatty
    if os.environ.get("T3AR_ACCESS_LOG", "true").strip().lower() in ("0", "false", "no", "off"):
        logging.getLogger("t3ar.access").setLevel(logging.WARNING)

"""URLs: credentials never shown in logs or on screens; ids sent as exactly one path segment."""

from __future__ import annotations

from urllib.parse import quote


def path_segment(value: str) -> str:
    """``value`` percent-encoded as one URL path segment, whatever it holds (``/``, ``?``, ``#``, control
    characters, ``.`` or ``..``, which HTTP clients would otherwise collapse), so a server receives it as given.
    Callers refuse an empty value themselves (it names nothing)."""
    segment = quote(value, safe="")
    return segment.replace(".", "%2E") if segment in (".", "..") else segment


def redact_url(url: str) -> str:
    """``url`` with any ``user:password@`` part replaced by ``***@`` (``redis://:pw@host:6379/0`` ->
    ``redis://***@host:6379/0``); other URLs unchanged."""
    scheme, sep, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    if not sep or "@" not in netloc:
        return url
    return f"{scheme}://***@{netloc.rsplit('@', 1)[1]}{slash}{path}"

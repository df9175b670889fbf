"""URLs in logs and on screens: credentials never shown."""

from __future__ import annotations


def redact_url(url: str) -> str:
    """``url`` with any ``user:password@`` part replaced by ``***@`` (``redis://:pw@host:6379/0`` ->
    ``redis://***@host:6379/0``); other URLs unchanged."""
    scheme, sep, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    if not sep or "@" not in netloc:
        return url
    return f"{scheme}://***@{netloc.rsplit('@', 1)[1]}{slash}{path}"

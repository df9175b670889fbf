"""The console's thumbnails: made once per image and cached, decoded reduced and bounded.

A thumbnail is keyed by what identifies the image's content (its sha256: the pool item's, or that of the bytes;
a target file's path, size and modification time) and kept in a bounded in-memory LRU, so a page of 48
thumbnails decodes each image once, not on every request. Decoding is bounded too: an image over
``max_pixels`` is refused before its pixels are read; a JPEG is decoded reduced (``draft``: a 1/2 to 1/8 scale
straight from the DCT); other formats are decoded once (unavoidable for a PNG) and reduced at once; at most
``decoders`` images are decoded at a time, and concurrent requests for the same image wait for the one decode.
The cache lives in the API process (a restart makes each thumbnail again, once).
"""

from __future__ import annotations

import hashlib
import io
import threading
from collections import OrderedDict
from collections.abc import Callable

from fastapi import Request
from fastapi.responses import Response
from PIL import Image

from t3ar.data.images import to_rgb

MAX_PIXELS = 40_000_000  # as the pool's and the targets' own limit (t3ar.data.images.open_image)


def render(data: bytes, size: int, max_pixels: int = MAX_PIXELS) -> bytes:
    """``data`` (any image Pillow reads) as a PNG of at most ``size`` × ``size``; ValueError for an image over
    ``max_pixels`` (before its pixels are decoded), Pillow's errors for what is no image."""
    with Image.open(io.BytesIO(data)) as img:
        width, height = img.size
        if width * height > max_pixels:
            raise ValueError(f"{width}x{height} pixels: over the limit of {max_pixels}")
        img.draft("RGB", (size, size))  # JPEG: decode at the smallest scale still >= size (no-op elsewhere)
        img.thumbnail((size, size), reducing_gap=2.0)  # reduce() by whole factors first, then resample
        out = to_rgb(img)
        buf = io.BytesIO()
        out.save(buf, "PNG")
        return buf.getvalue()


class Thumbnails:
    """Thumbnails of ``size`` pixels, cached (at most ``max_bytes`` of PNGs, least recently used dropped)."""

    def __init__(self, size: int = 128, *, max_bytes: int = 64 << 20, decoders: int = 2) -> None:
        self.size = size
        self.max_bytes = max_bytes
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._making: dict[str, threading.Lock] = {}
        self._decoders = threading.BoundedSemaphore(decoders)

    def cached(self, key: str) -> bytes | None:
        with self._lock:
            png = self._cache.get(key)
            if png is not None:
                self._cache.move_to_end(key)
            return png

    def _keep(self, key: str, png: bytes) -> None:
        with self._lock:
            if key not in self._cache:
                self._cache[key] = png
                self._bytes += len(png)
            while self._bytes > self.max_bytes and self._cache:
                _, dropped = self._cache.popitem(last=False)
                self._bytes -= len(dropped)

    def get(self, key: str, load: Callable[[], bytes]) -> bytes:
        """The thumbnail of the image ``load()`` returns, made only when ``key`` is not cached (``load`` is then
        called once, by one of the requests that asked at the same time)."""
        if (png := self.cached(key)) is not None:
            return png
        with self._lock:
            making = self._making.setdefault(key, threading.Lock())
        with making:
            try:
                if (png := self.cached(key)) is not None:
                    return png
                data = load()
                with self._decoders:
                    png = render(data, self.size)
                self._keep(key, png)
                return png
            finally:
                with self._lock:
                    self._making.pop(key, None)

    def of(self, data: bytes) -> bytes:
        """The thumbnail of ``data`` (keyed by its sha256)."""
        return self.get("sha256:" + hashlib.sha256(data).hexdigest(), lambda: data)


def thumbnails(request: Request) -> Thumbnails:
    """The app's thumbnail cache (made at start-up by :mod:`t3ar_services.api.console`)."""
    found: Thumbnails = request.app.state.console_thumbs
    return found


def png_response(data: bytes) -> Response:
    return Response(data, media_type="image/png", headers={"Cache-Control": "private, max-age=300"})

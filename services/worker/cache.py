"""The worker's disk caches: base checkpoints by sha256 (:class:`ModelCache`), and a
:class:`~t3ar.method.retrieval.NeighbourProvider` over the retriever service with a cache of fetched pool images.

A base checkpoint is named by its sha256, so it is fetched from the API once per worker data dir, whatever
the job; it is hashed again on every use, so a file changed on this disk is fetched anew, never used.

Pool ids are never reused by the retriever, so an id -> image-bytes cache never goes stale. Withdrawn ids are
dropped from the cache at the start of every job (:meth:`ImageCache.forget_withdrawn`: the ids withdrawn since the
cache's watermark, read from the API's bounded feed :mod:`t3ar_services.common.withdrawn`) so a withdrawn image
does not linger on worker disks, and the cache is trimmed (oldest first) to a byte budget.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PIL import Image

from t3ar_services.common import withdrawn

if TYPE_CHECKING:
    import numpy as np
    import torch

    from t3ar.clients.retriever import RetrieverClient

log = logging.getLogger(__name__)
_SAFE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
WATERMARK_FILE = ".withdrawn-seq"  # the last withdrawal feed entry this cache applied


def trim_oldest(paths: list[Path], budget: int) -> None:
    """Delete the oldest of ``paths`` (by modification time: written, or touched when used) until the rest take at
    most ``budget`` bytes."""
    files = [(p.stat().st_mtime, p.stat().st_size, p) for p in paths]
    total = sum(size for _, size, _ in files)
    for _, size, p in sorted(files):
        if total <= budget:
            break
        p.unlink(missing_ok=True)
        total -= size


class ImageCache:
    """Files ``<root>/<sha1(id)[:2]>/<id>``; writes are atomic (temp + rename) so concurrent workers may share it."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        root.mkdir(parents=True, exist_ok=True)

    def path(self, pool_id: str) -> Path:
        name = pool_id if _SAFE.match(pool_id) else hashlib.sha256(pool_id.encode()).hexdigest()
        return self.root / hashlib.sha1(pool_id.encode()).hexdigest()[:2] / name

    def get(self, pool_id: str) -> bytes | None:
        try:
            return self.path(pool_id).read_bytes()
        except OSError:
            return None

    def put(self, pool_id: str, data: bytes) -> None:
        if self.max_bytes <= 0:
            return
        path = self.path(pool_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)

    def forget_withdrawn(self, redis: Any) -> int:
        """Drop what was withdrawn since this cache last looked (everything, when the feed was trimmed past its
        watermark), then move the watermark (a file in the cache, shared by the workers using it). Returns how
        many files were dropped."""
        mark = self.root / WATERMARK_FILE
        try:
            after = int(mark.read_text().strip() or 0)
        except (OSError, ValueError):
            after = 0
        feed = withdrawn.read(redis, after)
        n = self.clear() if feed.reset else self.forget(feed.ids)
        if feed.upto != after:
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".", suffix=".tmp")
            with os.fdopen(fd, "w") as fh:
                fh.write(str(feed.upto))
            os.replace(tmp, mark)
        return n

    def clear(self) -> int:
        """Drop every cached image."""
        return self.forget_paths(p for p in self.root.glob("*/*") if p.is_file())

    def forget(self, pool_ids: Iterable[str]) -> int:
        return self.forget_paths(self.path(pid) for pid in pool_ids)

    @staticmethod
    def forget_paths(paths: Iterable[Path]) -> int:
        n = 0
        for path in paths:
            try:
                path.unlink()
                n += 1
            except FileNotFoundError:
                pass
        return n

    def trim(self) -> None:
        """Delete the least recently written files until the cache fits ``max_bytes``."""
        trim_oldest([p for p in self.root.glob("*/*") if p.is_file()], self.max_bytes)


class ModelCache:
    """Files ``<root>/<sha256>``, each one verified when it arrives and again when it is used; trimmed (least
    recently used first) to ``max_bytes``. With ``max_bytes`` 0 nothing is kept: files go to the job's scratch."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes

    def get(self, sha256: str, fetch: Callable[[Path], object], scratch: Path) -> tuple[Path, bool]:
        """The path of a verified file with this sha256 and whether it was cached; ``fetch(dest)`` downloads it
        (verified, atomically) when it is not."""
        from t3ar.digest import file_sha256

        if not re.fullmatch(r"[0-9a-f]{64}", sha256):
            raise ValueError(f"not a sha256: {sha256!r}")
        if self.max_bytes <= 0:
            scratch.mkdir(parents=True, exist_ok=True)
            dest = scratch / sha256
            fetch(dest)
            return dest, False
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / sha256
        if path.is_file():
            if file_sha256(path) == sha256:
                os.utime(path)  # recently used: trimmed last
                return path, True
            log.warning("cached file %s does not match its sha256; fetching it again", path)
            path.unlink(missing_ok=True)
        fetch(path)
        self.trim(keep=path)
        return path, False

    def trim(self, keep: Path) -> None:
        """Delete the least recently used files (but ``keep``) until the cache fits ``max_bytes``."""
        trim_oldest([p for p in self.root.iterdir() if p.is_file() and not p.name.startswith(".") and p != keep],
                    self.max_bytes - (keep.stat().st_size if keep.is_file() else 0))


class CachedRetrieverProvider:
    """NeighbourProvider: embed and search through the retriever, fetch through the cache.

    ``checkpoint`` is called between remote calls (the job's cancellation check).
    """

    def __init__(self, client: RetrieverClient, cache: ImageCache, *, batch_size: int = 128, fetch_workers: int = 4,
                 checkpoint: Callable[[], None] | None = None) -> None:
        from t3ar.clients.retriever import RetrieverProvider

        self.remote = RetrieverProvider(client, batch_size=batch_size, fetch_workers=fetch_workers)
        self.client = client
        self.cache = cache
        self.fetch_workers = fetch_workers
        self.checkpoint = checkpoint or (lambda: None)
        self.hits = 0
        self.misses = 0

    @property
    def identity(self) -> str:
        return self.remote.identity

    def size(self) -> int:
        return self.remote.size()

    def embed(self, images: torch.Tensor) -> np.ndarray:
        self.checkpoint()
        return self.remote.embed(images)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        self.checkpoint()
        return self.remote.search(queries, k)

    def search_label(self, queries: np.ndarray, k: int, label: str | None) -> tuple[np.ndarray, list[list[str]]]:
        """Class-conditional retrieval's label-filtered search, through the retriever."""
        self.checkpoint()
        return self.remote.search_label(queries, k, label)

    def sources(self, ids: Sequence[str]) -> list[str]:
        self.checkpoint()
        return self.remote.sources(ids)

    def labels(self, ids: Sequence[str]) -> list[str | None]:
        self.checkpoint()
        return self.remote.labels(ids)

    def all_ids(self) -> list[str]:
        self.checkpoint()
        return self.remote.all_ids()

    def _bytes(self, pool_id: str) -> bytes:
        data = self.cache.get(pool_id)
        if data is not None:
            self.hits += 1
            return data
        data = self.client.get_image(pool_id)
        self.misses += 1
        try:
            self.cache.put(pool_id, data)
        except OSError as e:  # a full or read-only cache disk must not fail the job
            log.warning("could not cache pool image %s: %s", pool_id, e)
        return data

    def fetch(self, ids: Sequence[str]) -> list[Image.Image]:
        from t3ar.data.images import open_image

        self.checkpoint()
        with ThreadPoolExecutor(max_workers=self.fetch_workers) as ex:
            blobs = list(ex.map(self._bytes, ids))
        return [open_image(b) for b in blobs]

"""Decoding untrusted image bytes and embedding them with the pool's retriever R.

Imports torch (through the embedder): the service loads this module only when it has an embedder, so a
vectors-only retriever stays small. One embedding runs at a time (the forward pass already uses every core);
decoding, hashing and blob I/O of other requests overlap with it.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Sequence

import numpy as np
import torch

from t3ar.data.images import open_image, to_tensor_uint8
from t3ar.embedder import Embedder
from t3ar.errors import ImageDecodeError
from t3ar_services.retriever.pool import AddOutcome, Candidate
from t3ar_services.retriever.uploads import Item

log = logging.getLogger(__name__)

_MEDIA = [(b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"), (b"GIF8", "image/gif"),
          (b"BM", "image/bmp"), (b"II*\x00", "image/tiff"), (b"MM\x00*", "image/tiff")]


def sniff_media_type(data: bytes) -> str | None:
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return next((mt for magic, mt in _MEDIA if data.startswith(magic)), None)


class ImageIngestor:
    def __init__(self, embedder: Embedder, *, max_pixels: int, batch_size: int) -> None:
        self.embedder = embedder
        self.max_pixels = max_pixels
        self.batch_size = batch_size
        self._embed_slot = threading.Lock()

    @property
    def identity(self) -> str:
        return self.embedder.identity

    @property
    def dim(self) -> int:
        return self.embedder.dim

    def _decode(self, name: str, data: bytes) -> tuple[torch.Tensor, int, int]:
        try:
            img = open_image(data, max_pixels=self.max_pixels)
        except ImageDecodeError as e:
            raise ImageDecodeError(str(e).replace("<bytes>", name, 1)) from e
        return to_tensor_uint8(img, self.embedder.spec.image_size), img.width, img.height

    def _embed(self, tensors: Sequence[torch.Tensor]) -> np.ndarray:
        if not tensors:
            return np.empty((0, self.dim), dtype=np.float32)
        with self._embed_slot:
            return self.embedder.embed(torch.stack(list(tensors)), batch_size=self.batch_size)

    def prepare(self, items: Sequence[Item], known: Callable[[list[str]], dict[str, str]]) -> list[
            Candidate | AddOutcome]:
        """Hash, skip what the pool already holds (``exists``, not decoded), decode and embed the rest.
        Unreadable images become ``rejected`` outcomes; order is kept."""
        shas = [hashlib.sha256(it[1]).hexdigest() if isinstance(it, tuple) else "" for it in items]
        already = known([s for s in shas if s])
        out: list[Candidate | AddOutcome] = []
        pending: list[tuple[Candidate, torch.Tensor]] = []
        for it, sha in zip(items, shas, strict=True):
            if isinstance(it, AddOutcome):
                out.append(it)
                continue
            name, data = it
            if sha in already:
                out.append(AddOutcome(name, "exists", already[sha], sha, duplicate_of=already[sha], score=1.0))
                continue
            try:
                tensor, width, height = self._decode(name, data)
            except ImageDecodeError as e:
                out.append(AddOutcome.rejected(name, "bad_image", str(e), sha))
                continue
            cand = Candidate(name, data, sha, sniff_media_type(data), width, height)
            pending.append((cand, tensor))
            out.append(cand)
        vecs = self._embed([t for _, t in pending])
        for (cand, _), vec in zip(pending, vecs, strict=True):
            cand.vector = vec
        return out

    def embed_bytes(self, datas: Sequence[bytes], names: Sequence[str]) -> np.ndarray:
        """All-or-nothing: ImageDecodeError names the first unreadable item."""
        tensors = [self._decode(name, data)[0] for name, data in zip(names, datas, strict=True)]
        return self._embed(tensors)

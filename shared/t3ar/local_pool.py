"""An in-process pool: images on disk, their embeddings and an exact faiss inner-product index.

Implements :class:`t3ar.method.retrieval.NeighbourProvider` for `t3ar adapt --pool DIR` and the
benchmarks; the retriever service offers the same over HTTP.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from PIL import Image

from t3ar.data.datasets import ImageSet
from t3ar.data.images import open_image
from t3ar.embedder import Embedder
from t3ar.errors import DatasetError

if TYPE_CHECKING:
    import faiss

log = logging.getLogger(__name__)


def build_flat_index(vectors: np.ndarray, ids: np.ndarray) -> faiss.Index:
    """Exact inner-product index with our own int64 ids (IndexIDMap2 supports remove/reconstruct)."""
    # imported here, not at module level: the benchmark's GPU grid runner imports the bench code (BenchPool is a
    # LocalPool) on a machine without faiss and never builds an index there
    import faiss

    index = faiss.IndexIDMap2(faiss.IndexFlatIP(vectors.shape[1]))
    if len(vectors):
        index.add_with_ids(np.ascontiguousarray(vectors, dtype=np.float32), ids.astype(np.int64))
    return index


class LocalPool:
    """A read-only pool held in this process."""

    def __init__(self, embedder: Embedder, paths: Sequence[Path], ids: Sequence[str], vectors: np.ndarray,
                 labels: Sequence[str | None] | None = None) -> None:
        if len(paths) != len(ids) or len(ids) != len(vectors):
            raise ValueError("paths, ids and vectors must have the same length")
        if labels is not None and len(labels) != len(ids):
            raise ValueError("labels must be aligned with the ids (one per image, None = unlabelled)")
        self._labels: list[str | None] = list(labels) if labels is not None else [None] * len(ids)
        self.embedder = embedder
        self._paths = list(paths)
        self._ids = list(ids)
        self._row = {pid: i for i, pid in enumerate(self._ids)}
        self.vectors = vectors
        self.index = build_flat_index(vectors, np.arange(len(vectors)))

    @classmethod
    def from_imageset(cls, imageset: ImageSet, embedder: Embedder, *, batch_size: int = 128,
                      labels: Sequence[str | None] | None = None) -> LocalPool:
        """Embed every image of ``imageset``; ``labels`` (aligned with its ids, None = unlabelled) are the pool
        labels."""
        if len(imageset) == 0:
            raise DatasetError("the pool is empty: give a folder or archive with images")
        vecs = []
        for start in range(0, len(imageset), batch_size):
            chunk = [open_image(p) for p in imageset.paths[start:start + batch_size]]
            vecs.append(embedder.embed(chunk, batch_size=batch_size))
        vectors = np.concatenate(vecs)
        log.info("local pool: %d images embedded with %s", len(vectors), embedder.identity)
        return cls(embedder, imageset.paths, imageset.ids, vectors, labels)

    @property
    def identity(self) -> str:
        return self.embedder.identity

    def size(self) -> int:
        return len(self._ids)

    def embed(self, images: torch.Tensor) -> np.ndarray:
        return self.embedder.embed(images)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        k_eff = min(k, self.size())
        scores, rows = self.index.search(np.ascontiguousarray(queries, dtype=np.float32), k_eff)
        ids = [[self._ids[r] if r >= 0 else "" for r in row] for row in rows]
        return scores, ids

    def search_label(self, queries: np.ndarray, k: int, label: str | None) -> tuple[np.ndarray, list[list[str]]]:
        """:meth:`search` among the items labelled ``label`` only (None: every item), exact; rows padded with ''
        (score -inf) where fewer items carry the label."""
        if label is None:
            return self.search(queries, k)
        rows = np.array([i for i, lab in enumerate(self._labels) if lab == label], dtype=np.int64)
        q = np.ascontiguousarray(queries, dtype=np.float32)
        scores = np.full((len(q), k), -np.inf, dtype=np.float32)
        ids = [[""] * k for _ in range(len(q))]
        if len(rows) and len(q):
            sims = q @ self.vectors[rows].T
            order = np.argsort(-sims, axis=1, kind="stable")[:, :k]
            for i, row in enumerate(order):
                scores[i, :len(row)] = sims[i, row]
                ids[i][:len(row)] = [self._ids[rows[j]] for j in row]
        return scores, ids

    def all_ids(self) -> list[str]:
        return list(self._ids)

    def sources(self, ids: Sequence[str]) -> list[str]:
        """A local pool's source of an image is the top folder it lies in under the pool's root ('' at the root)."""
        return [i.split("/", 1)[0] if "/" in i else "" for i in ids]

    def labels(self, ids: Sequence[str]) -> list[str | None]:
        """The pool label of each id (``labels`` given at construction; None = unlabelled)."""
        return [self._labels[self._row[i]] for i in ids]

    def fetch(self, ids: Sequence[str]) -> list[Image.Image]:
        return [open_image(self._paths[self._row[i]]) for i in ids]

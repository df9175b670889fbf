"""Neighbour selection (pure) and the provider interface the harness uses to reach a pool.

The paper's dedup: take the top r·k neighbours and sample k of them uniformly, so near-duplicates of the
query are rarely the negatives. Neighbour lists are computed once per job (R is fixed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch
from PIL import Image


def dedup_sample(candidates: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """Sample ``k`` of each row's candidates uniformly without replacement.

    candidates: [N, m] long, m >= k; entries < 0 are missing results (faiss' -1) and are never chosen.
    Rows with fewer than k valid candidates return all they have, padded with -1.
    """
    n, m = candidates.shape
    if k > m:
        raise ValueError(f"need at least k={k} candidates per query, got {m}")
    scores = torch.rand(n, m, generator=generator)
    scores = scores.masked_fill(candidates < 0, 2.0)  # invalid ones sort last
    order = scores.argsort(dim=1)[:, :k]
    return candidates.gather(1, order)


def random_neighbours(n_queries: int, pool_size: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """The 'random retrieval' baseline: k distinct uniformly random pool indices per query."""
    if pool_size < k:
        raise ValueError(f"pool has {pool_size} items, cannot draw k={k}")
    return torch.rand(n_queries, pool_size, generator=generator).argsort(dim=1)[:, :k]


class NeighbourProvider(Protocol):
    """What the adaptation harness needs from a pool (in-process faiss index now, HTTP retriever later)."""

    @property
    def identity(self) -> str:
        """The embedder identity of the pool (R)."""
        ...

    def size(self) -> int: ...

    def embed(self, images: torch.Tensor) -> np.ndarray:
        """Embed uint8 [N,3,H,W] images with the pool's R -> float32 [N, d] unit vectors."""
        ...

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        """Top-k pool ids per query (by inner product) -> (scores [N,k], ids). Missing results: ''."""
        ...

    def all_ids(self) -> list[str]: ...

    def fetch(self, ids: Sequence[str]) -> list[Image.Image]:
        """The pool images (RGB) for these ids."""
        ...

    def sources(self, ids: Sequence[str]) -> list[str]:
        """The source of each of these pool ids (what ``AdaptConfig.pool_data_sources`` names)."""
        ...

    def labels(self, ids: Sequence[str]) -> list[str | None]:
        """The pool label of each of these pool ids (None = unlabelled): what labelled neighbours train with."""
        ...

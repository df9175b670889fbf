"""A fake pool for the tests of retrieval and of the candidates harness (:class:`SixItemPool`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image


class SixItemPool:
    """A NeighbourProvider over 6 pool items 'a'..'f' (8×8 images whose red is the id's code point) with the same
    neighbours for every query: the first k of a, b, c, d, scored 0.99, 0.6, 0.5, 0.4 ('a' is a near-duplicate of
    every query). Counts the questions it is asked (``calls``: embeds, searches, images fetched), keeps the ids it
    fetched in order (``fetched``); every item is from source 'x' and has no label."""

    def __init__(self) -> None:
        self.calls = {"embed": 0, "search": 0, "fetch": 0}
        self.fetched: list[str] = []

    @property
    def identity(self) -> str:
        return "fake"

    def size(self) -> int:
        return 6

    def embed(self, images: torch.Tensor) -> np.ndarray:
        self.calls["embed"] += 1
        return np.ones((len(images), 4), dtype=np.float32) / 2

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        self.calls["search"] += 1
        ids, scores = ["a", "b", "c", "d"][:k], [0.99, 0.6, 0.5, 0.4][:k]
        return np.array([scores] * len(queries), dtype=np.float32), [list(ids) for _ in queries]

    def all_ids(self) -> list[str]:
        return list("abcdef")

    def fetch(self, ids: Sequence[str]) -> list[Image.Image]:
        self.calls["fetch"] += len(ids)
        self.fetched += list(ids)
        return [Image.new("RGB", (8, 8), (ord(i), 0, 0)) for i in ids]

    def sources(self, ids: Sequence[str]) -> list[str]:
        return ["x"] * len(ids)

    def labels(self, ids: Sequence[str]) -> list[str | None]:
        return [None] * len(ids)

"""Labelled neighbours as data: which labelled pool items train a step, drawn three ways. Pure torch.

A pool item may carry a class label (a labelled archive, a train-time job's contribution); the harness maps it to
the model's classes (-1 = none, or a class the model does not have). With ``AdaptConfig.pool_label_weight`` > 0
the labelled ones among a step's distinct retrieved neighbours train with their label (a cross-entropy of their
weak views), at most ``pool_label_cap`` per step. How the items are drawn (:class:`LabelDraw`):

* ``retrieved`` (the product): the step's distinct neighbours that carry a label;
* ``random`` (a benchmark control): as many labelled items as ``retrieved`` would give this step, drawn
  uniformly from every labelled item of the pool (what matching class names gives a team without image
  retrieval: does retrieval select better labelled data than chance?);
* ``all`` (a benchmark reference): ``pool_label_cap`` items per step from the whole labelled pool, in a seeded
  order that visits every item before repeating one (mixing the whole labelled archive in; its cost is the
  images it touches).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch

LabelDrawMode = Literal["retrieved", "random", "all"]
LABEL_DRAWS: tuple[LabelDrawMode, ...] = get_args(LabelDrawMode)

__all__ = ["LABEL_DRAWS", "LabelDraw", "LabelDrawMode", "balance_weights", "labelled_neighbours"]


def labelled_neighbours(pool_local: torch.Tensor, known: torch.Tensor, cap: int, gen: torch.Generator) -> torch.Tensor:
    """The step's distinct neighbours (``pool_local`` [P'] local pool indices) that carry a label (``known`` [P]
    class per pool item, -1 = none), at most ``cap`` of them (a uniform draw from ``gen`` when there are more;
    ``gen`` is drawn from only then). Returns local pool indices, sorted."""
    rows = pool_local[known[pool_local] >= 0]
    if len(rows) > cap:
        rows = rows[torch.randperm(len(rows), generator=gen)[:cap]].sort().values
    return rows


def balance_weights(labels: torch.Tensor) -> torch.Tensor:
    """Per-row weights that give every class present the same total weight, summing to the row count
    (a class-balanced mean of the cross-entropy)."""
    _, inverse, counts = torch.unique(labels, return_inverse=True, return_counts=True)
    w = 1.0 / counts[inverse].float()
    return w * (len(labels) / w.sum())


@dataclass
class LabelDraw:
    """Draws each step's labelled data items (see the module docstring). ``known`` [P] the class of each pool
    item (-1 = none), on the CPU; ``gen`` its own random stream (so the draw changes no other part of a run)."""

    mode: LabelDrawMode
    known: torch.Tensor
    cap: int
    gen: torch.Generator

    def __post_init__(self) -> None:
        if self.mode not in LABEL_DRAWS:
            raise ValueError(f"unknown label draw {self.mode!r}; choose from {', '.join(LABEL_DRAWS)}")
        self.known = self.known.cpu().long()
        self.labelled = (self.known >= 0).nonzero().flatten()
        self._order = torch.empty(0, dtype=torch.long)

    def __call__(self, pool_local: torch.Tensor | None) -> torch.Tensor:
        """Local pool indices of this step's labelled data items (possibly none). ``pool_local``: the step's
        distinct retrieved neighbours (None or empty: no neighbours)."""
        empty = torch.empty(0, dtype=torch.long)
        if self.mode == "all":
            return self._next(min(self.cap, len(self.labelled)))
        if pool_local is None or not len(pool_local):
            return empty
        rows = labelled_neighbours(pool_local.cpu(), self.known, self.cap, self.gen)
        if self.mode == "retrieved" or not len(rows):
            return rows
        pick = torch.randperm(len(self.labelled), generator=self.gen)[: len(rows)]
        return self.labelled[pick].sort().values

    def _next(self, n: int) -> torch.Tensor:
        """``n`` items of the whole labelled pool: a seeded permutation, renewed when it runs out."""
        out: list[torch.Tensor] = []
        while n > 0 and len(self.labelled):
            if not len(self._order):
                self._order = self.labelled[torch.randperm(len(self.labelled), generator=self.gen)]
            take, self._order = self._order[:n], self._order[n:]
            out.append(take)
            n -= len(take)
        return torch.cat(out).sort().values if out else torch.empty(0, dtype=torch.long)

"""How good a job's neighbours are (issue 52, item 1): pure functions, tensors in, numbers out.

A retrieved neighbour only pays when it finds what the model cannot: a labelled neighbour whose label is the target
image's true class is worth more than the model's own guess only if retrieval lands in the right class more often
than the guess does. These functions measure that for a job's drawn neighbours:

- :func:`label_agreement`: the share of labelled neighbours whose label is a reference class per query (the target
  image's pseudo-label; on a holdout or a labelled target its true label: precision@k over labelled neighbours);
- :func:`hit_rate`: the share of queries with at least one labelled neighbour of the reference class (how often a
  relevant item is among the k at all, what matters in a large mixed pool);
- :func:`source_mix`: how many drawn neighbours came from each pool source.

Class indices are the model's; ``-1`` marks an unlabelled or missing neighbour, or a query whose reference is
unknown (such queries are left out).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

__all__ = ["Agreement", "NeighbourQuality", "hit_rate", "label_agreement", "source_mix"]


@dataclass(frozen=True)
class Agreement:
    """``matches`` of ``labelled`` labelled neighbours (over ``queries`` queries with a known reference) carry the
    reference class; ``share`` is None when no neighbour was labelled."""

    matches: int
    labelled: int
    queries: int

    @property
    def share(self) -> float | None:
        return self.matches / self.labelled if self.labelled else None


def _check(neighbour_classes: torch.Tensor, reference: torch.Tensor) -> None:
    if neighbour_classes.ndim != 2 or reference.ndim != 1 or len(neighbour_classes) != len(reference):
        raise ValueError(f"neighbour_classes must be [N, k] and reference [N]; got {list(neighbour_classes.shape)} "
                         f"and {list(reference.shape)}")


def label_agreement(neighbour_classes: torch.Tensor, reference: torch.Tensor) -> Agreement:
    """Of the labelled neighbours (``neighbour_classes`` [N, k] long, -1 = unlabelled or missing) of the queries
    whose ``reference`` ([N] long) is known (>= 0), how many carry the reference class."""
    _check(neighbour_classes, reference)
    known = reference >= 0
    nc = neighbour_classes[known]
    labelled = nc >= 0
    matches = (nc == reference[known].unsqueeze(1)) & labelled
    return Agreement(int(matches.sum()), int(labelled.sum()), int(known.sum()))


def hit_rate(neighbour_classes: torch.Tensor, reference: torch.Tensor) -> float | None:
    """The share of queries with a known reference that have at least one neighbour of that class (None: no such
    query)."""
    _check(neighbour_classes, reference)
    known = reference >= 0
    if not bool(known.any()):
        return None
    hit = (neighbour_classes[known] == reference[known].unsqueeze(1)).any(dim=1)
    return float(hit.float().mean())


def source_mix(sources: Sequence[Sequence[str]]) -> dict[str, int]:
    """How many drawn neighbours came from each pool source (rows of sources, one per query; '' = a missing
    neighbour, not counted), most first, then by name."""
    counts: dict[str, int] = {}
    for row in sources:
        for s in row:
            if s:
                counts[s] = counts.get(s, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


@dataclass(frozen=True)
class NeighbourQuality:
    """A job's neighbour quality, as its report carries it (see :mod:`t3ar.clients.job_report`)."""

    ranking: str  # the retrieval option that drew them (RetrievalOptions.ranking)
    k: int
    neighbours: int  # drawn neighbours in all (N x k less missing ones)
    pseudo: Agreement | None = None  # against the target images' pseudo-labels
    truth: Agreement | None = None  # against true labels (a holdout or a labelled target): precision@k
    truth_on: str | None = None  # "holdout" or "target"
    truth_hit_rate: float | None = None
    sources: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        """The report's ``neighbour_quality`` (JSON numbers; shares rounded to 4 decimals)."""
        def agreement(a: Agreement | None) -> dict[str, object] | None:
            if a is None:
                return None
            return {"share": None if a.share is None else round(a.share, 4), "matches": a.matches,
                    "labelled": a.labelled, "queries": a.queries}

        return {"ranking": self.ranking, "k": self.k, "neighbours": self.neighbours,
                "pseudo_label_agreement": agreement(self.pseudo), "precision_at_k": agreement(self.truth),
                "precision_on": self.truth_on,
                "hit_rate": None if self.truth_hit_rate is None else round(self.truth_hit_rate, 4),
                "sources": dict(self.sources)}

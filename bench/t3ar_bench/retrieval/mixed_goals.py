"""The mixed-pool goals of issue 52, in points, paired over the cells (shift x seed) of the mixed-pool arms
(:mod:`t3ar_bench.retrieval.mixed_main`, phase ``mixed``): pure functions of the run records.

* ``mixed_retrieval_vs_uniform``: ``t3ar`` - ``t3ar-random`` (retrieval against uniform random draws, labels unused);
* ``mixed_labelled_vs_uniform``: ``t3ar-labels`` - ``t3ar-random-labels`` (labelled retrieval against the labelled
  items among uniform random draws);
* ``mixed_labelled_vs_random``: ``t3ar-labels`` - ``t3ar-labels-random`` (against class-matched random labelled
  items); ``mixed_labelled_vs_bn_adapt``; ``mixed_whole_pool_vs_bn_adapt`` (what the labels can give at all).

Each is ``{"test": {fraction: {"mean", "lo", "hi", "n", "per_shift"}}}`` (the adaptation benchmark's goal shape).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from t3ar_bench.method.goals import Cells, paired_cells

#: goal -> (arm a, arm b): a - b
MIXED_GOALS: dict[str, tuple[str, str]] = {
    "mixed_retrieval_vs_uniform": ("t3ar", "t3ar-random"),
    "mixed_labelled_vs_uniform": ("t3ar-labels", "t3ar-random-labels"),
    "mixed_labelled_vs_random": ("t3ar-labels", "t3ar-labels-random"),
    "mixed_class_conditional_vs_uniform": ("t3ar-labels-class-conditional", "t3ar-random-labels"),
    "mixed_labelled_vs_bn_adapt": ("t3ar-labels", "bn-adapt"),
    "mixed_whole_pool_vs_bn_adapt": ("t3ar-labels-all", "bn-adapt"),
}


def mixed_cells(records: Sequence[Mapping[str, Any]], label: str) -> Cells:
    """``label``'s evaluation top-1 per (shift, seed, fraction) among the mixed-pool records."""
    return {(r["shift"], int(r["seed"]), float(r["fraction"])): float(r["top1"]) for r in records
            if r.get("label") == label and r.get("phase") == "mixed"}


def mixed_goals(records: Sequence[Mapping[str, Any]], shifts: Sequence[str], seeds: Sequence[int],
                fractions: Sequence[float]) -> dict[str, Any]:
    """Every goal of :data:`MIXED_GOALS` whose cells are all there (a goal without them is left out)."""
    out: dict[str, Any] = {}
    for name, (a, b) in MIXED_GOALS.items():
        ca, cb = mixed_cells(records, a), mixed_cells(records, b)
        table = {str(f): d for f in fractions if (d := paired_cells(ca, cb, shifts, seeds, f)) is not None}
        if table:
            out[name] = {"test": table}
    return out

"""The mixed-pool goals of issue 52, in points, paired over the evaluation cells (shift x seed) of the mixed-pool
grid (:mod:`t3ar_bench.retrieval.mixed_grid`, phase ``mixed``): pure functions of the run records.

``LABELLED`` stands for the labelled-retrieval arm that validation chose (:func:`choose_labelled`: the ranking
option with the best mean top-1 on the validation shift; ``t3ar-labels``, the index's ranking, on a tie):

* ``mixed_retrieval_vs_uniform``: ``t3ar`` - ``t3ar-random`` (retrieval against uniform random draws from the whole
  pool, labels unused: the paper's claim and control);
* ``mixed_labelled_vs_uniform``: LABELLED - ``t3ar-random-labels`` (against the labelled items among uniform
  random draws);
* ``labelled_vs_random``: LABELLED - ``t3ar-labels-random`` (against as many labelled items of the task's classes
  drawn at random: the class-matched random control);
* ``labelled_vs_bn_adapt``: LABELLED - ``bn-adapt``; ``whole_pool_vs_bn_adapt``: the whole-pool reference -
  ``bn-adapt`` (what the labels can give at all); ``whole_pool_vs_labelled``: the reference - LABELLED;
* ``recipe_balanced`` / ``recipe_second_stage``: the recipe's arms - ``t3ar-labels`` (item 4);
* ``accepted_vs_bn_adapt_labelled`` / ``accepted_vs_hindsight_labelled``: the model the acceptance gate returns
  among source, bn-adapt and LABELLED (by their 1-per-class holdout, the product's winner rule) - bn-adapt, and
  - the best of the three in hindsight.

Each is ``{"test": {fraction: {"mean", "lo", "hi", "n", "per_shift"}}}`` (the adaptation benchmark's goal shape).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from t3ar_bench.method.goals import Cells, accepted_cells, hindsight_cells, paired_cells

LABELLED = "<labelled>"
#: the labelled-retrieval arms validation chooses among, simplest first (a tie keeps the earlier)
RANKING_ARMS: dict[str, str] = {"index": "t3ar-labels", "class-conditional": "t3ar-labels-class-conditional",
                                "base-rerank": "t3ar-labels-base-rerank"}
#: goal -> (arm a, arm b): a - b
MIXED_GOALS: dict[str, tuple[str, str]] = {
    "mixed_retrieval_vs_uniform": ("t3ar", "t3ar-random"),
    "mixed_labelled_vs_uniform": (LABELLED, "t3ar-random-labels"),
    "labelled_vs_random": (LABELLED, "t3ar-labels-random"),
    "labelled_vs_bn_adapt": (LABELLED, "bn-adapt"),
    "retrieval_vs_bn_adapt": ("t3ar", "bn-adapt"),
    "whole_pool_vs_bn_adapt": ("t3ar-labels-all", "bn-adapt"),
    "whole_pool_vs_labelled": ("t3ar-labels-all", LABELLED),
    "recipe_balanced": ("t3ar-labels-balanced", "t3ar-labels"),
    "recipe_second_stage": ("t3ar-labels-second-stage", "t3ar-labels"),
}
#: the acceptance gate's candidates on the labelled path, simplest first
ACCEPT_CANDIDATES: tuple[str, ...] = ("source", "bn-adapt", LABELLED)


def mixed_cells(records: Sequence[Mapping[str, Any]], label: str) -> Cells:
    """``label``'s evaluation top-1 per (shift, seed, fraction) among the mixed-pool records."""
    return {(r["shift"], int(r["seed"]), float(r["fraction"])): float(r["top1"]) for r in records
            if r.get("label") == label and r.get("phase") == "mixed"}


def validation_means(records: Sequence[Mapping[str, Any]], shift: str, labels: Sequence[str]) -> dict[str, float]:
    """Each arm's mean top-1 over the seeds and fractions of ``shift`` (the arms with runs there)."""
    out = {}
    for label in labels:
        vals = [v for k, v in mixed_cells(records, label).items() if k[0] == shift]
        if vals:
            out[label] = statistics.mean(vals)
    return out


def choose_labelled(records: Sequence[Mapping[str, Any]], validation: str) -> str:
    """The labelled-retrieval arm with the best mean top-1 on the validation shift (the simplest on a tie)."""
    means = validation_means(records, validation, list(RANKING_ARMS.values()))
    if not means:
        return RANKING_ARMS["index"]
    best = max(means.values())
    return next(a for a in RANKING_ARMS.values() if means.get(a) == best)


def mixed_goals(records: Sequence[Mapping[str, Any]], shifts: Sequence[str], seeds: Sequence[int],
                fractions: Sequence[float], labelled: str = RANKING_ARMS["index"]) -> dict[str, Any]:
    """Every goal of :data:`MIXED_GOALS` whose cells are all there (a goal without them is left out), with
    ``labelled`` for :data:`LABELLED`; and the acceptance goals where every candidate recorded its holdout."""
    def name(a: str) -> str:
        return labelled if a == LABELLED else a

    out: dict[str, Any] = {}
    pairs = {g: (name(a), name(b)) for g, (a, b) in MIXED_GOALS.items()}
    for goal, (a, b) in pairs.items():
        ca, cb = mixed_cells(records, a), mixed_cells(records, b)
        table = {str(f): d for f in fractions if (d := paired_cells(ca, cb, shifts, seeds, f)) is not None}
        if table:
            out[goal] = {"test": table}
    candidates = tuple(name(c) for c in ACCEPT_CANDIDATES)
    as_main = [{**r, "phase": "main"} for r in records if r.get("phase") == "mixed"]
    accepted, _ = accepted_cells(as_main, 1, candidates)
    for goal, other in (("accepted_vs_bn_adapt_labelled", mixed_cells(records, "bn-adapt")),
                        ("accepted_vs_hindsight_labelled", hindsight_cells(as_main, candidates))):
        table = {str(f): d for f in fractions if (d := paired_cells(accepted, other, shifts, seeds, f)) is not None}
        if table:
            out[goal] = {"test": table}
    return out


def accepted_wins(records: Sequence[Mapping[str, Any]], labelled: str) -> dict[str, int]:
    """How often each candidate is the accepted model over the mixed-pool cells."""
    candidates = tuple(labelled if c == LABELLED else c for c in ACCEPT_CANDIDATES)
    _, won = accepted_cells([{**r, "phase": "main"} for r in records if r.get("phase") == "mixed"], 1, candidates)
    counts: dict[str, int] = {}
    for w in won.values():
        counts[w] = counts.get(w, 0) + 1
    return counts

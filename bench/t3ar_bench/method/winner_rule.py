"""Which acceptance winner rule a job uses, chosen on the validation shifts like every other choice of the
benchmark (pure functions of run records: no I/O, no torch).

The product has two rules (:mod:`t3ar.acceptance`): ``argmax`` (the best holdout top-1, a tie to the simpler) and
``paired`` (the simpler candidate unless a paired bootstrap CI on the holdout favours another). On each validation
cell (shift x selection seed, at the selection fraction) the candidates (source, bn-adapt, the validated T3AR) have
their holdout records; each rule picks a winner per cell, the winner's *evaluation* top-1 is what the rule earns,
and a rule is scored by its worst validation shift (the mean over seeds on that shift), at the goals' holdout size
(the plan's first). The better worst-shift score wins; a tie keeps :data:`TIE_RULE`, the conservative ``paired``
(fixed here, not the product's default, which follows this choice). Evaluation shifts are never looked at.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, get_args

from t3ar.acceptance import Rule
from t3ar_bench.method.goals import CANDIDATES, choose_winner

#: (shift, seed) -> {candidate: its record: ``top1`` (evaluation part) and ``holdout`` ({size: {top1, n, correct}})}
ValidationCells = Mapping[tuple[str, int], Mapping[str, Mapping[str, Any]]]
#: the rule a tie (or no decidable cell) keeps: the one that keeps the simpler model unless the holdout shows a gain
TIE_RULE: Rule = "paired"


def rule_scores(cells: ValidationCells, rule: Rule, per_class: int,
                candidates: Sequence[str] = CANDIDATES) -> dict[str, Any]:
    """What ``rule`` earns on the validation cells at holdout size ``per_class``: per shift the mean evaluation
    top-1 of its winners, the worst shift's, how often each candidate won, and the cells decided."""
    per: dict[str, list[float]] = {}
    wins: Counter[str] = Counter()
    for (shift, seed), arms in sorted(cells.items()):
        if any(m not in arms for m in candidates):
            continue
        h = {m: (arms[m].get("holdout") or {}).get(str(per_class)) for m in candidates}
        if any(v is None or not v.get("n") for v in h.values()):
            continue
        w = choose_winner({m: v for m, v in h.items() if v}, candidates, rule, seed=seed)
        if w is None:
            continue
        wins[w] += 1
        per.setdefault(shift, []).append(float(arms[w]["top1"]))
    per_shift = {s: statistics.mean(v) for s, v in per.items()}
    return {"rule": rule, "per_class": per_class, "cells": sum(len(v) for v in per.values()),
            "per_shift": per_shift, "worst": min(per_shift.values()) if per_shift else math.nan,
            "wins": dict(wins)}


def choose_rule(cells: ValidationCells, sizes: Sequence[int], default: Rule = TIE_RULE) -> dict[str, Any]:
    """Every rule's :func:`rule_scores` at every holdout size in ``sizes``, and the rule chosen by the worst-shift
    score at the first size (a tie, or no decidable cell, keeps ``default``)."""
    rules: tuple[Rule, ...] = get_args(Rule)
    table = [rule_scores(cells, r, k) for k in sizes for r in rules]
    first = {t["rule"]: t["worst"] for t in table if sizes and t["per_class"] == sizes[0]}

    def score(r: Rule) -> float:
        v = first.get(r, math.nan)
        return -math.inf if math.isnan(v) else v

    chosen = max(rules, key=lambda r: (score(r), r == default))  # a tie (or nothing decided) keeps the default
    return {"chosen": chosen, "default": default, "per_class": sizes[0] if sizes else None,
            "shifts": sorted({s for s, _ in cells}), "table": table}

"""The method benchmark's arms and how validation scores them: what the grid protocol
(:mod:`t3ar_bench.method.grid`) and the labelled-pool protocol (:mod:`t3ar_bench.method.labelled`) share.

An arm is a JSON-able dict (phase, shift, seed, fraction, method, lr and any extra field: options, mode,
retriever, label, ...) that :func:`t3ar_bench.method.runs.run_all` runs; a record is what a run returns, with the
arm's fields and its ``top1``.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from t3ar_bench.method.plans import BenchPlan, validation_shifts

#: the nominal lr of arms that have no optimiser (bn-adapt); AdaptConfig needs one
NO_LR = 1e-3

#: what tells the arms of a phase apart (a field an arm lacks matches records that lack it too)
ARM_FIELDS = ("phase", "shift", "fraction", "method", "lr", "options", "mode", "retriever", "oracle_pool_labels",
              "label_draw")


def make_arm(phase: str, shift: str, seed: int, fraction: float, method: str, lr: float,
             **extra: Any) -> dict[str, Any]:
    return {"phase": phase, "shift": shift, "seed": seed, "fraction": fraction, "method": method, "lr": lr, **extra}


def mean_top1(records: Sequence[Mapping[str, Any]], arm: Mapping[str, Any]) -> float:
    """Mean top-1 of the records of ``arm`` over its seeds (matched on every field of :data:`ARM_FIELDS`)."""
    vals = [r["top1"] for r in records if all(r.get(k) == arm.get(k) for k in ARM_FIELDS)]
    return statistics.mean(vals) if vals else math.nan


def worst_top1(records: Sequence[Mapping[str, Any]], arm: Mapping[str, Any], shifts: Sequence[str]) -> float:
    """The worst over ``shifts`` of ``arm``'s mean top-1 (:func:`mean_top1`): how validation scores a candidate
    when it has several shifts (one of them may be where the base model is weak); NaN when a shift has no run."""
    return min((mean_top1(records, {**arm, "shift": s}) for s in shifts), key=lambda v: (not math.isnan(v), v))


def seeded_arms(p: BenchPlan, phase: str, method: str, lr: float, **extra: Any) -> list[dict[str, Any]]:
    """The arm on every validation shift and selection seed of ``p`` (at its selection fraction)."""
    return [make_arm(phase, v, s, p.select_fraction, method, lr, **extra) for v in validation_shifts(p)
            for s in p.select_seeds]


def arm_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """An arm's ``options`` field (absent when empty), JSON-normalised (tuples become lists), so that arms compare
    equal to the records read back from the run cache."""
    return {"options": json.loads(json.dumps(dict(options)))} if options else {}

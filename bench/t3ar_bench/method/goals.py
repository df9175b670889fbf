"""The method benchmark's goals, in points, paired over the evaluation cells (shift x seed): pure functions of the run
records (no I/O, no torch).

Each goal is ``{mode: {fraction: {"mean", "lo", "hi", "n", "per_shift": {shift: mean}}}}``: the mean of the paired
per-(shift, seed) differences with its 95 % CI (Student t over the n = shifts x seeds cells) and each shift's mean
over seeds. The goals of the acceptance round:

* ``accepted_vs_bn_adapt``, ``accepted_vs_source``, ``accepted_vs_hindsight``: the *accepted* model of a cell is
  the winner among :data:`CANDIDATES` (source, bn-adapt, the default T3AR) on its acceptance holdout (the first of
  ``plan.holdout_per_class`` labelled images per class, from the adaptation part, never adapted on; each run
  records its holdout top-1), scored on the held-out evaluation part; *hindsight* is, per shift and fraction, the
  candidate with the best mean evaluation top-1 over seeds (what a perfect choice of one method per shift gives);
  ``acceptance_curve`` repeats the three for every holdout size; the winner rule (``acceptance_rule``) is the one
  validation chose (:mod:`t3ar_bench.method.winner_rule`), and ``acceptance_other_rule`` gives the same goals
  under the product's other rule;
* ``no_harm``: the default T3AR (no holdout) − bn-adapt;
* ``labelled_vs_random``, ``labelled_vs_bn_adapt`` and the other labelled-pool comparisons.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from t3ar.acceptance import Rule, decide
from t3ar_bench.method.labelled import ALL_ARM, LABELS_ARM, RANDOM_ARM
from t3ar_bench.method.plans import BenchPlan, paired

#: the acceptance candidates, simplest first (a tie goes to the earlier): the base model, bn-adapt, the default T3AR
CANDIDATES: tuple[str, ...] = ("source", "bn-adapt", "t3ar")
#: (shift, seed, fraction) -> a value
Cells = dict[tuple[str, int, float], float]


def choose_winner(holdouts: Mapping[str, Mapping[str, Any]], order: Sequence[str] = CANDIDATES,
                  rule: Rule = "argmax", seed: int = 0) -> str | None:
    """The winner among ``order`` by the product's winner rule (:func:`t3ar.acceptance.decide`) on their holdout
    records (``{"top1", "n", "correct"}``). Records without per-image correctness (runs from before it was kept)
    are decided by ``argmax`` on their top-1 (the same rule: highest, ties to the simpler); ``paired`` needs the
    per-image vectors (None without them)."""
    vectors: dict[str, Sequence[bool]] = {m: v for m in order if (v := holdouts[m].get("correct"))}
    if len(vectors) == len(order):
        return decide(vectors, rule, seed=seed).winner
    if rule != "argmax":
        return None
    best = order[0]
    for name in order[1:]:
        s = float(holdouts[name].get("top1", math.nan))
        if not math.isnan(s) and (math.isnan(float(holdouts[best].get("top1", math.nan))) or
                                  s > float(holdouts[best]["top1"])):
            best = name
    return best


def _key(r: Mapping[str, Any]) -> tuple[str, int, float]:
    return (r["shift"], int(r["seed"]), float(r["fraction"]))


def arm_cells(records: Sequence[Mapping[str, Any]], label: str, phase: str = "main") -> Cells:
    """``label``'s evaluation top-1 per (shift, seed, fraction) (``source`` and ``bn-adapt`` from the test grid)."""
    ph = "main" if label in ("source", "bn-adapt") else phase
    return {_key(r): float(r["top1"]) for r in records if r.get("label") == label and r["phase"] == ph}


def accepted_cells(records: Sequence[Mapping[str, Any]], per_class: int, candidates: Sequence[str] = CANDIDATES,
                   rule: Rule = "argmax") -> tuple[Cells, dict[tuple[str, int, float], str]]:
    """Per cell where every candidate recorded its holdout of ``per_class`` images per class: the winner's
    evaluation top-1, and the winner (by ``rule``, :func:`choose_winner`)."""
    by: dict[tuple[str, int, float], dict[str, Mapping[str, Any]]] = {}
    for r in records:
        if r.get("label") in candidates and r["phase"] == "main" and r.get("holdout"):
            by.setdefault(_key(r), {})[r["label"]] = r
    top: Cells = {}
    won: dict[tuple[str, int, float], str] = {}
    for key, arms in by.items():
        if set(arms) != set(candidates):
            continue
        h = {m: arms[m]["holdout"].get(str(per_class)) for m in candidates}
        if any(v is None or not v.get("n") for v in h.values()):
            continue  # no holdout image left in this cell
        w = choose_winner({m: v for m, v in h.items() if v}, candidates, rule, seed=key[1])
        if w is not None:
            won[key], top[key] = w, float(arms[w]["top1"])
    return top, won


def hindsight_cells(records: Sequence[Mapping[str, Any]], candidates: Sequence[str] = CANDIDATES) -> Cells:
    """Per cell, the evaluation top-1 of the candidate with the best mean over seeds on that shift and fraction."""
    per = {m: arm_cells(records, m) for m in candidates}
    groups: dict[tuple[str, float], list[tuple[str, int, float]]] = {}
    for key in per[candidates[0]]:
        groups.setdefault((key[0], key[2]), []).append(key)
    out: Cells = {}
    for keys in groups.values():
        if not all(k in per[m] for m in candidates for k in keys):
            continue
        best = max(candidates, key=lambda m: (statistics.mean(per[m][k] for k in keys), -candidates.index(m)))
        out.update({k: per[best][k] for k in keys})
    return out


def paired_cells(a: Cells, b: Cells, shifts: Sequence[str], seeds: Sequence[int], fraction: float
                 ) -> dict[str, Any] | None:
    """``a`` − ``b`` in points over every (shift, seed) of ``fraction``: mean, 95 % CI (t over the shifts x seeds
    cells), n and each shift's mean; None when a cell is missing on either side."""
    keys = [(sh, s, fraction) for sh in shifts for s in seeds]
    if not keys or any(k not in a or k not in b for k in keys):
        return None
    d = paired([100 * a[k] for k in keys], [100 * b[k] for k in keys])
    per_shift = {sh: statistics.mean(100 * (a[k] - b[k]) for k in keys if k[0] == sh) for sh in shifts}
    return {"mean": d["mean"], "lo": d["lo"], "hi": d["hi"], "n": d["n"], "per_shift": per_shift}


def _table(a: Cells, b: Cells, plan: BenchPlan, fractions: Sequence[float]) -> dict[str, dict[str, Any]]:
    return {str(f): d for f in fractions
            if (d := paired_cells(a, b, plan.eval_shifts, plan.seeds, f)) is not None}


def acceptance(plan: BenchPlan, records: Sequence[Mapping[str, Any]], per_class: int,
               rule: Rule = "argmax") -> dict[str, Any]:
    """The three acceptance goals at one holdout size (test time) with winner rule ``rule``, and how often each
    candidate won."""
    acc, won = accepted_cells(records, per_class, rule=rule)
    fs = plan.fractions
    wins = {str(f): dict(Counter(w for k, w in won.items() if math.isclose(k[2], f))) for f in fs}
    return {"accepted_vs_bn_adapt": {"test": _table(acc, arm_cells(records, "bn-adapt"), plan, fs)},
            "accepted_vs_source": {"test": _table(acc, arm_cells(records, "source"), plan, fs)},
            "accepted_vs_hindsight": {"test": _table(acc, hindsight_cells(records), plan, fs)},
            "wins": wins}


def goals(p: BenchPlan, records: Sequence[Mapping[str, Any]], rule: Rule = "argmax") -> dict[str, Any]:
    """Every goal (module docstring), in points, and ``checks`` against the thresholds; the acceptance goals
    under winner rule ``rule`` (the one validation chose, :mod:`t3ar_bench.method.winner_rule`), the other rule's
    beside them."""
    def t(label: str, phase: str = "main") -> Cells:
        return arm_cells(records, label, phase)

    def table(a: str, b: str, fractions: Sequence[float], phase: str = "main") -> dict[str, dict[str, Any]]:
        return _table(t(a, phase), t(b, phase), p, fractions)

    other: Rule = "paired" if rule == "argmax" else "argmax"
    curve = {str(k): acceptance(p, records, k, rule) for k in p.holdout_per_class}
    first = curve[str(p.holdout_per_class[0])] if p.holdout_per_class else {}
    out: dict[str, Any] = {
        **{g: first.get(g, {"test": {}}) for g in ("accepted_vs_bn_adapt", "accepted_vs_source",
                                                    "accepted_vs_hindsight")},
        "acceptance_per_class": p.holdout_per_class[0] if p.holdout_per_class else None,
        "acceptance_curve": curve,
        # the winner rule validation chose, and the goals under the product's other rule (reported, not chosen
        # here: from the runs' per-image holdout correctness)
        "acceptance_rule": rule,
        "acceptance_other_rule": {"rule": other,
                                  "curve": {str(k): acceptance(p, records, k, other) for k in p.holdout_per_class}},
        "no_harm": {"test": table("t3ar", "bn-adapt", p.fractions)},
        "labelled_vs_random": {"test": table(LABELS_ARM, RANDOM_ARM, p.fractions),
                               "train": table(LABELS_ARM, RANDOM_ARM, p.train_fractions, "train")},
        "labelled_vs_bn_adapt": {"test": table(LABELS_ARM, "bn-adapt", p.fractions)},
        "labelled_vs_supervised": {"train": table(LABELS_ARM, "supervised", p.train_fractions, "train")},
        "labelled_vs_adacontrast": {"test": table(LABELS_ARM, "adacontrast", p.fractions)},
        "labelled_vs_unlabelled": {"test": table(LABELS_ARM, "t3ar", p.fractions),
                                   "train": table(LABELS_ARM, "t3ar", p.train_fractions, "train")},
        "all_vs_labelled": {"test": table(ALL_ARM, LABELS_ARM, p.whole_pool_fractions)},
        "unit": "points",
    }
    checks: list[dict[str, Any]] = []

    def check(name: str, d: Mapping[str, Any] | None, ok: bool | None) -> None:
        checks.append({"check": name, "value": None if d is None else d["mean"],
                       "ci": None if d is None else [d["lo"], d["hi"]], "met": bool(ok) if d is not None else None})

    def worst(d: Mapping[str, Any]) -> float:
        return min(d["per_shift"].values())

    for f in p.fractions:
        pc = 100 * f
        d = out["accepted_vs_bn_adapt"]["test"].get(str(f))
        check(f"acceptance, test {pc:g} %: accepted − bn-adapt ≥ +0.5, CI's lower end ≥ −0.3, ≥ −0.5 on every shift",
              d, d is not None and d["mean"] >= 0.5 and d["lo"] >= -0.3 and worst(d) >= -0.5)
        d = out["accepted_vs_source"]["test"].get(str(f))
        check(f"acceptance, test {pc:g} %: accepted − source ≥ +3", d, d is not None and d["mean"] >= 3)
        d = out["accepted_vs_hindsight"]["test"].get(str(f))
        check(f"acceptance, test {pc:g} %: accepted − the best candidate of each shift in hindsight ≥ −1.0", d,
              d is not None and d["mean"] >= -1.0)
    for f in p.fractions:
        d = out["no_harm"]["test"].get(str(f))
        check(f"no harm, test {100 * f:g} %: validated T3AR (unlabelled pool) − bn-adapt ≥ 0, CI's lower end ≥ −0.5, "
              "≥ −1.0 on every shift", d, d is not None and d["mean"] >= 0 and d["lo"] >= -0.5 and worst(d) >= -1.0)
        d = out["labelled_vs_random"]["test"].get(str(f))
        check(f"labelled retrieval pays, test {100 * f:g} %: T3AR with the labelled pool − its random-labelled "
              "control ≥ +1.5, CI above 0", d, d is not None and d["mean"] >= 1.5 and d["lo"] > 0)
    for f in p.fractions:
        if math.isclose(f, 0.3):
            d = out["labelled_vs_bn_adapt"]["test"].get(str(f))
            check("test 30 %: T3AR with the labelled pool − bn-adapt ≥ +3, CI above 0", d,
                  d is not None and d["mean"] >= 3 and d["lo"] > 0)
            d = out["labelled_vs_adacontrast"]["test"].get(str(f))
            check("test 30 %: T3AR with the labelled pool ≥ AdaContrast", d, d is not None and d["mean"] >= 0)
    sup = list(out["labelled_vs_supervised"]["train"].values())
    if p.train_fractions:
        best = max(sup, key=lambda d: d["mean"]) if sup else None
        check("train time: T3AR with the labelled pool − supervised fine-tuning ≥ +3, CI above 0, at 10 % or 30 %",
              best, any(d["mean"] >= 3 and d["lo"] > 0 for d in sup))
    out["checks"] = checks
    return out

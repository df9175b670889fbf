"""The method benchmark's labelled-pool protocol: the 'no harm' options of the T3AR family, labelled
neighbours as data with their controls (the goals are :mod:`t3ar_bench.method.goals`').

On the validation shift only (after :func:`t3ar_bench.method.grid.select_design`):

1. **No harm.** The family's BatchNorm and second-stage options (``plan.no_harm_options``), greedily on top of the
   validated T3AR (unlabelled pool), each kept when it beats the best so far; the kept ones apply to the whole
   family's frozen arms but the paper-faithful one. Then the product's default: the validated T3AR when it beats
   bn-adapt on validation, else whichever of bn-adapt, AdaContrast and the validated T3AR validation prefers.
2. **Labelled neighbours.** On the validated T3AR with the pool's labels, ``pool_label_weight`` 1 first, then each
   of ``plan.label_options`` greedily. Train time takes the test-time choices (said in the report).

The grid adds per cell: ``t3ar-labels`` (the validated T3AR with the pool's labels: retrieved labelled neighbours
train with their label), ``t3ar-labels-random`` (the same arm, the same number of labelled items per step drawn at
random among every labelled pool item: what matching class names gives without image retrieval) and, at
``plan.whole_pool_fractions``, ``t3ar-labels-all`` (``pool_label_cap`` items of the whole labelled pool mixed
into every step: the reference, with its cost in images). The unlabelled arms see the same pool without labels.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from t3ar_bench.method.arms import NO_LR, arm_options, make_arm, seeded_arms, worst_top1
from t3ar_bench.method.plans import BenchPlan, validation_shifts
from t3ar_bench.method.runs import Context, run_all

LABELS_ARM, RANDOM_ARM, ALL_ARM = "t3ar-labels", "t3ar-labels-random", "t3ar-labels-all"
LABEL_ARMS: tuple[str, ...] = (LABELS_ARM, RANDOM_ARM, ALL_ARM)
#: the label draw of each labelled arm (t3ar.method.pool_labels)
DRAWS = {LABELS_ARM: "retrieved", RANDOM_ARM: "random", ALL_ARM: "all"}
#: the candidates for the product's default job method when the family does not beat bn-adapt on validation
DEFAULT_CANDIDATES: tuple[str, ...] = ("bn-adapt", "adacontrast", "t3ar")


def _top(ctx: Context, recs: Sequence[Mapping[str, Any]], arm: Mapping[str, Any]) -> float:
    """``arm``'s validation score: its mean top-1 on the worst validation shift."""
    p = ctx.plan
    return worst_top1(recs, {"phase": "select", "fraction": p.select_fraction, **arm}, validation_shifts(p))


def _seeded(p: BenchPlan, method: str, lr: float, **extra: Any) -> list[dict[str, Any]]:
    return seeded_arms(p, "select", method, lr, **extra)


def _greedy(ctx: Context, cache: Path, base: Mapping[str, Any], start: Mapping[str, Any],
            candidates: Sequence[tuple[str, Sequence[tuple[str, Any]]]], lr: float,
            extra: Mapping[str, Any]) -> tuple[dict[str, Any], float, list[dict[str, Any]]]:
    """Greedy choice on validation: from ``base`` + ``start`` options, each candidate kept when it beats the best
    so far (a tie keeps what was). Returns (options, their top-1, the table)."""
    p = ctx.plan
    opts = {**base, **start}
    recs = run_all(ctx, _seeded(p, "t3ar", lr, **arm_options(opts), **extra), cache)
    best = _top(ctx, recs, {"method": "t3ar", "lr": lr, **arm_options(opts), **extra})
    table = [{"option": "start: " + (", ".join(f"{k} {v}" for k, v in start.items()) or "the validated T3AR"),
              "top1": best, "base_top1": best, "kept": True}]
    for name, option in candidates:
        trial = {**opts, **dict(option)}
        recs = run_all(ctx, _seeded(p, "t3ar", lr, **arm_options(trial), **extra), cache)
        got = _top(ctx, recs, {"method": "t3ar", "lr": lr, **arm_options(trial), **extra})
        table.append({"option": name, "top1": got, "base_top1": best, "kept": got > best})
        if got > best:
            opts, best = trial, got
    return opts, best, table


def select_labelled(ctx: Context, cache: Path, sel: dict[str, Any]) -> dict[str, Any]:
    """Stages 1 and 2 of the module docstring on top of ``sel`` (``select_design``'s); returns ``sel`` extended:
    ``family_options`` (the kept no-harm options), ``validated`` updated, ``no_harm_table``, ``default``,
    ``labelled`` (options and table)."""
    p = ctx.plan
    lr = sel["lr"]["t3ar-noretrieval"]
    v = sel["validated"]
    extra = {"retriever": v["retriever"]} if "retriever" in v else {}
    base = dict(v["options"])
    # ("lr", "third"): a third of the family's lr (the option names it relative to what validation chose)
    no_harm = [(name, tuple((k, lr / 3 if (k, val) == ("lr", "third") else val) for k, val in option))
               for name, option in p.no_harm_options]
    opts, best, table = _greedy(ctx, cache, base, {}, no_harm, lr, extra)
    family = {k: val for k, val in opts.items() if k not in base}
    out = dict(sel)
    out["family_options"] = family
    out["no_harm_table"] = table
    out["validated"] = {**v, "options": arm_options(opts).get("options", {})}
    out["validated_top1_no_harm"] = best
    # the product's default job method: what validation prefers when the family does not beat bn-adapt
    recs_bn = run_all(ctx, _seeded(p, "bn-adapt", NO_LR, **arm_options({"train_groups": sel["bn_groups"]})), cache)
    bn = _top(ctx, recs_bn, {"method": "bn-adapt", "lr": NO_LR, **arm_options({"train_groups": sel["bn_groups"]})})
    tops = {"bn-adapt": bn, "t3ar": best}
    if "adacontrast" in sel["lr"]:  # validated (a plan that skips it everywhere has no lr for it)
        recs_ac = run_all(ctx, _seeded(p, "adacontrast", sel["lr"]["adacontrast"]), cache)
        tops["adacontrast"] = _top(ctx, recs_ac, {"method": "adacontrast", "lr": sel["lr"]["adacontrast"]})
    method = "t3ar" if best > bn else max((m for m in DEFAULT_CANDIDATES if m in tops),
                                          key=lambda m: (tops[m], m == "bn-adapt"))
    out["default"] = {"method": method, "validation_top1": tops,
                      "rule": "the validated T3AR when it beats bn-adapt on validation (its worst shift), else the "
                              "best of "
                              f"{', '.join(DEFAULT_CANDIDATES)} there"}
    # labelled neighbours as data, on the validated T3AR with the pool's labels
    start = {"pool_label_weight": 1.0}
    lab_extra = {**extra, "label_draw": "retrieved"}
    lab_opts, lab_best, lab_table = _greedy(ctx, cache, dict(opts), start, p.label_options, lr, lab_extra)
    out["labelled"] = {"options": arm_options(lab_opts).get("options", {}), "top1": lab_best, "table": lab_table,
                       "gain_on_validation": lab_best - best}
    return out


def labelled_arms(p: BenchPlan, sel: Mapping[str, Any], shift: str, seed: int) -> list[dict[str, Any]]:
    """The labelled arms of one (shift, seed): test time at every fraction (the whole-pool reference at
    ``plan.whole_pool_fractions``), train time at every train fraction (labels and the random control)."""
    v = sel["validated"]
    extra = {"retriever": v["retriever"]} if "retriever" in v else {}
    options = dict(sel["labelled"]["options"])
    arms = []
    for f in p.fractions:
        for label in LABEL_ARMS:
            if label == ALL_ARM and not any(math.isclose(f, w) for w in p.whole_pool_fractions):
                continue
            arms.append(make_arm("main", shift, seed, f, "t3ar", sel["lr"]["t3ar-noretrieval"], label=label,
                                 label_draw=DRAWS[label], options=options, **extra))
    for f in p.train_fractions:
        for label in (LABELS_ARM, RANDOM_ARM):
            arms.append(make_arm("train", shift, seed, f, "t3ar", sel["train_lr"]["t3ar-noretrieval"],
                                 mode="train", label=label, label_draw=DRAWS[label], options=options, **extra))
    return arms


def label_use_summary(records: Sequence[Mapping[str, Any]], phase: str, f: float) -> dict[str, dict[str, Any]]:
    """Per labelled arm of a cell: labelled items per step, the share of them from each pool style, and the share
    whose label is the class of a query that retrieved them (retrieved draws) or of any image of the adapted
    subset (random and whole-pool draws), averaged over its runs."""
    out: dict[str, dict[str, Any]] = {}
    for label in LABEL_ARMS:
        got = [r["label_use"] for r in records if r.get("label") == label and r["phase"] == phase
               and math.isclose(r["fraction"], f) and r.get("label_use")]
        if not got:
            continue
        styles = sorted({s for g in got for s in g["style_share"]})
        out[label] = {"per_step": statistics.mean(g["per_step"] for g in got),
                      "query_class_share": statistics.mean(g["query_class_share"] for g in got),
                      "distinct": statistics.mean(g["distinct"] for g in got),
                      "style_share": {s: statistics.mean(g["style_share"].get(s, 0.0) for g in got) for s in styles}}
    return out

"""The method benchmark's protocol: the choices made on the validation shift, the paired evaluation grid, and
its summary against the goal.

Validation (google → each of :func:`~t3ar_bench.method.plans.validation_shifts`, ``select_fraction``,
``select_seeds``; with several validation shifts a candidate scores its worst shift's mean, not the mean over
them; nothing is chosen from the evaluation shifts):

1. the retriever R with the best retrieval quality (same-class share of the top 5, from the emoji side labels,
   which are allowed on validation only; :mod:`t3ar_bench.method.quality`);
2. each baseline's lr (TENT, SHOT-IM, AdaContrast) and ``bn-adapt``'s layers (``plan.bn_groups``);
3. the T3AR family's schedule and contrastive term, on T3AR without retrieval: its lr, then the term (AdaptConfig's
   default or one of ``plan.contrastive_settings``); shared by every arm of the family, so the validated T3AR and
   T3AR without retrieval differ by retrieval alone (the latter is the former's retrieval-off twin);
4. the retrieval options of the validated T3AR, greedily on top of the family's setting with R: each of
   ``plan.retrieval_options`` in turn, kept when it beats the best so far (a tie keeps the paper's behaviour);
5. train-time lrs (supervised fine-tuning, the family), the rest carried over from test time.

``t3ar-paper`` is T3AR as the paper describes it (the default R, the k = 5 of the top 25 as negatives only) at the
family's schedule and term; ``t3ar`` is T3AR as validated. The grid runs every arm of a (shift, seed, fraction)
cell on the same source model, subset, batch order and target views (paired).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from t3ar_bench.method.arms import ARM_FIELDS, NO_LR, arm_options, make_arm, seeded_arms, worst_top1
from t3ar_bench.method.labelled import ALL_ARM, LABEL_ARMS, label_use_summary, labelled_arms
from t3ar_bench.method.plans import BenchPlan, paired, validation_shifts
from t3ar_bench.method.quality import choose_retriever, quality_table
from t3ar_bench.method.runs import Context, run_all, source_record
from t3ar_bench.method.winner_rule import choose_rule

#: the arms of the test-time grid, in report order (``source`` is the source model, evaluated)
TEST_ARMS: tuple[str, ...] = ("source", "bn-adapt", "tent", "shot-im", "adacontrast", "sar", "eata",
                              "t3ar-noretrieval", "t3ar-paper", "t3ar")
#: the arms of the train-time grid (labelled adaptation part)
TRAIN_ARMS: tuple[str, ...] = ("supervised", "t3ar-noretrieval", "t3ar-paper", "t3ar")
#: the diagnostic arm: the validated T3AR with neighbours as data whose known (emoji) neighbours carry their true
#: labels; reported, never a candidate
ORACLE = "oracle"
BASELINES: tuple[str, ...] = ("tent", "shot-im", "adacontrast")
#: baselines run only when the method registry has them (SAR and EATA: methods of their own files)
OPTIONAL_BASELINES: tuple[str, ...] = ("sar", "eata")
def baselines(p: BenchPlan, *, labelled_default: bool = False) -> list[str]:
    """The baselines ``p`` runs: :data:`BASELINES` and the registered :data:`OPTIONAL_BASELINES`, less the grid's
    skipped ones (AdaContrast stays with ``labelled_default``: the product's default may fall back to it)."""
    from t3ar.method import registry

    known = set(registry.names())
    return [m for m in (*BASELINES, *OPTIONAL_BASELINES) if (m in BASELINES or m in known)
            and (m not in p.grid_skip or (labelled_default and m == "adacontrast"))]


def select_design(ctx: Context, cache: Path) -> dict[str, Any]:
    """Every choice of the validation shift (see the module docstring), with the tables the report shows."""
    p = ctx.plan
    quality = quality_table(ctx)
    retriever = choose_retriever(quality, p.validation_shift, p.retrievers)
    fam = "t3ar-noretrieval"
    # a baseline the grid does not run needs no lr (but AdaContrast's, a candidate for the product's default)
    base = baselines(p, labelled_default=p.labelled)
    train = ("supervised", fam) if p.train_fractions else ()  # train-time lrs only for a plan with train cells
    arms = [a for m in (*base, fam) for lr in p.lr_grid for a in seeded_arms(p, "select", m, lr)]
    arms += [a for g in p.bn_groups
             for a in seeded_arms(p, "select", "bn-adapt", NO_LR, **arm_options({"train_groups": g}))]
    arms += [a for m in train for lr in p.lr_grid for a in seeded_arms(p, "select-train", m, lr, mode="train")]
    recs = run_all(ctx, arms, cache)

    def top(phase: str, method: str, lr: float, options: Mapping[str, Any] | None = None, **extra: Any) -> float:
        return worst_top1(recs, {"phase": phase, "fraction": p.select_fraction, "method": method, "lr": lr,
                                 **arm_options(options or {}), **extra}, validation_shifts(p))

    lr_table = [{"method": m, "mode": "test", "lr": lr, "top1": top("select", m, lr)}
                for m in (*base, fam) for lr in p.lr_grid]
    lr_table += [{"method": m, "mode": "train", "lr": lr, "top1": top("select-train", m, lr, mode="train")}
                 for m in train for lr in p.lr_grid]
    def best_lr(phase: str, method: str, **extra: Any) -> float:
        return max(p.lr_grid, key=lambda lr: top(phase, method, lr, **extra))  # a tie keeps the lower lr

    lrs = {m: best_lr("select", m) for m in (*base, fam)}
    train_lrs = {m: best_lr("select-train", m, mode="train") for m in train}
    bn_table = [{"train_groups": g, "top1": top("select", "bn-adapt", NO_LR, {"train_groups": g})} for g in p.bn_groups]
    bn_groups = max(p.bn_groups, key=lambda g: top("select", "bn-adapt", NO_LR, {"train_groups": g}))

    # the family's contrastive term at its lr: the default (the lr grid's own run) or one change at a time
    settings: list[dict[str, Any]] = [{}, *(dict(c) for c in p.contrastive_settings)]
    recs += run_all(ctx, [a for c in settings[1:] for a in seeded_arms(p, "select", fam, lrs[fam], **arm_options(c))],
                    cache)
    term_top = [top("select", fam, lrs[fam], c) for c in settings]
    term_table = [{"setting": c, "top1": t} for c, t in zip(settings, term_top, strict=True)]
    term = settings[max(range(len(settings)), key=lambda i: term_top[i])]  # a tie keeps the default

    # the retrieval options, greedily on top of the family's setting, with the chosen retriever
    extra_r = {"retriever": retriever} if retriever != p.retrievers[0] else {}
    paper_arms = seeded_arms(p, "select", "t3ar", lrs[fam], **arm_options(term))
    r_arms = seeded_arms(p, "select", "t3ar", lrs[fam], **arm_options(term), **extra_r) if extra_r else []
    recs += run_all(ctx, paper_arms + r_arms, cache)
    paper_top = top("select", "t3ar", lrs[fam], term)
    kept: dict[str, Any] = {}
    best = top("select", "t3ar", lrs[fam], term, **extra_r)
    option_table = [{"option": f"retriever {retriever} (by retrieval quality)", "top1": best, "base_top1": paper_top,
                     "kept": True}]
    for name, option in p.retrieval_options:
        trial = {**term, **kept, **dict(option)}
        recs += run_all(ctx, seeded_arms(p, "select", "t3ar", lrs[fam], **arm_options(trial), **extra_r), cache)
        got = top("select", "t3ar", lrs[fam], trial, **extra_r)
        option_table.append({"option": name, "top1": got, "base_top1": best, "kept": got > best})
        if got > best:
            kept.update(dict(option))
            best = got
    src = {v: statistics.mean(source_record(ctx, v, s)["top1"] for s in p.select_seeds) for v in validation_shifts(p)}
    validated = {"phase": "select", "fraction": p.select_fraction, "method": "t3ar", "lr": lrs[fam],
                 **arm_options({**term, **kept}), **extra_r}
    bn = {"phase": "select", "fraction": p.select_fraction, "method": "bn-adapt", "lr": NO_LR,
          **arm_options({"train_groups": bn_groups})}
    rule = choose_rule(validation_cells(ctx, recs, bn, validated), p.holdout_per_class) \
        if p.holdout_per_class else None
    return {"shift": p.validation_shift, "shifts": list(src), "fraction": p.select_fraction,
            "seeds": list(p.select_seeds), "source_top1": min(src.values()), "source_top1_by_shift": src,
            "quality": quality, "retriever": retriever,
            "lr": lrs, "train_lr": train_lrs, "lr_table": lr_table, "bn_groups": bn_groups, "bn_table": bn_table,
            "term": term, "term_table": term_table, "options": arm_options(kept).get("options", {}),
            "options_table": option_table,
            "paper_top1": paper_top, "validated_top1": best,
            "validated_beats_paper": best > paper_top, "winner_rule": rule,
            "validated": {"method": "t3ar", **extra_r, "options": arm_options({**term, **kept}).get("options", {})}}


def validation_cells(ctx: Context, recs: Sequence[Mapping[str, Any]], bn: Mapping[str, Any],
                     validated: Mapping[str, Any]) -> dict[tuple[str, int], dict[str, Mapping[str, Any]]]:
    """The acceptance candidates' records per validation cell (shift, selection seed): the source model's
    (:func:`source_record` with its holdouts), bn-adapt's and the validated T3AR's selection runs (``bn`` and
    ``validated``: their arms without shift and seed)."""
    p = ctx.plan
    cells: dict[tuple[str, int], dict[str, Mapping[str, Any]]] = {}
    for v in validation_shifts(p):
        for s in p.select_seeds:
            cell: dict[str, Mapping[str, Any]] = {"source": source_record(ctx, v, s, p.select_fraction)}
            for name, arm in (("bn-adapt", bn), ("t3ar", validated)):
                want = {**arm, "shift": v}
                got = [r for r in recs if r.get("seed") == s and all(r.get(k) == want.get(k) for k in ARM_FIELDS)]
                if got:
                    cell[name] = got[0]
            cells[(v, s)] = cell
    return cells


def _family(sel: Mapping[str, Any], label: str, mode: str = "test") -> tuple[str, float, dict[str, Any]]:
    """(method, lr, extra arm fields) of a T3AR-family arm as frozen."""
    lr = sel["train_lr" if mode == "train" else "lr"]["t3ar-noretrieval"]
    term = dict(sel["term"])
    if label == "t3ar-noretrieval":  # the validated T3AR's retrieval-off twin: the term and the family's options
        return "t3ar-noretrieval", lr, arm_options({**term, **sel.get("family_options", {})})
    if label == "t3ar-paper":
        return "t3ar", lr, arm_options(term)
    v = sel["validated"]
    return "t3ar", lr, {**arm_options(v["options"]), **({"retriever": v["retriever"]} if "retriever" in v else {})}


def grid_arms(p: BenchPlan, sel: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every arm of the evaluation grid (labelled; identical runs under two labels are run once: the run cache's
    key ignores the label)."""
    arms = []
    for shift in p.eval_shifts:
        for seed in p.seeds:
            for f in p.fractions:
                for label in TEST_ARMS[1:]:
                    if label in p.grid_skip:
                        continue
                    curves = p.curves and seed == p.seeds[0] and math.isclose(f, p.select_fraction) \
                        and label in ("t3ar-noretrieval", "t3ar-paper", "t3ar")
                    if label == "bn-adapt":
                        arms.append(make_arm("main", shift, seed, f, "bn-adapt", NO_LR, label=label,
                                             options={"train_groups": sel["bn_groups"]}))
                    elif label in OPTIONAL_BASELINES and label not in sel["lr"]:
                        continue  # not registered when validation ran: no lr, no arm
                    elif label in (*BASELINES, *OPTIONAL_BASELINES):
                        arms.append(make_arm("main", shift, seed, f, label, sel["lr"][label], label=label))
                    else:
                        method, lr, extra = _family(sel, label)
                        arms.append(make_arm("main", shift, seed, f, method, lr, label=label, curves=curves, **extra))
            fa = p.ablation_fraction
            method, lr, extra = _family(sel, "t3ar")
            options = dict(extra.get("options", {}))
            options["pool_data_weight"] = options.get("pool_data_weight") or 1.0
            if ORACLE not in p.grid_skip:
                arms.append(make_arm("main", shift, seed, fa, method, lr, label=ORACLE, oracle_pool_labels=True,
                                     **{**extra, "options": options}))
            if p.labelled:
                arms += labelled_arms(p, sel, shift, seed)
            for f in p.train_fractions:
                arms.append(make_arm("train", shift, seed, f, "supervised", sel["train_lr"]["supervised"],
                                     mode="train", label="supervised"))
                for label in TRAIN_ARMS[1:]:
                    if label in p.train_skip:
                        continue
                    method, lr, extra = _family(sel, label, "train")
                    arms.append(make_arm("train", shift, seed, f, method, lr, mode="train", label=label, **extra))
    return arms


def per_seed(records: Sequence[Mapping[str, Any]], shifts: Sequence[str], seeds: Sequence[int], fraction: float,
             label: str, phase: str) -> list[float]:
    """Per seed, the mean over ``shifts`` of the top-1 of ``label``'s records (NaN where one is missing)."""
    out = []
    for s in seeds:
        vals = [r["top1"] for r in records if r["seed"] == s and r["shift"] in shifts and r.get("label") == label
                and r["phase"] == phase and math.isclose(r["fraction"], fraction)]
        out.append(statistics.mean(vals) if len(vals) == len(shifts) else math.nan)
    return out


def _ci(d: Mapping[str, Any]) -> dict[str, float]:
    return {"mean": d["mean"], "lo": d["lo"], "hi": d["hi"]}


def summarise_grid(p: BenchPlan, sel: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Cells, paired differences (to bn-adapt, retrieval alone, to the paper-faithful T3AR) and the verdict."""
    seeds, shifts = list(p.seeds), list(p.eval_shifts)
    phases = {"test": "main", "train": "train"}
    from t3ar_bench.method.goals import goals
    from t3ar_bench.method.label_free import leave_one_shift_out, selection_cells, verdict

    arms = {"test": [*TEST_ARMS, ORACLE, *LABEL_ARMS], "train": [*TRAIN_ARMS, *(a for a in LABEL_ARMS if a != ALL_ARM)]}
    fractions = {"test": p.fractions, "train": p.train_fractions}
    cells: dict[str, dict[str, dict[str, Any]]] = {"test": {}, "train": {}}
    vs_bn: dict[str, dict[str, dict[str, Any]]] = {"test": {}, "train": {}}
    alone: dict[str, dict[str, Any]] = {"test": {}, "train": {}}
    vs_paper: dict[str, dict[str, Any]] = {"test": {}, "train": {}}
    for mode, phase in phases.items():
        for f in fractions[mode]:
            row: dict[str, Any] = {}
            bn = per_seed(records, shifts, seeds, f, "bn-adapt", "main")
            for label in arms[mode]:
                per = per_seed(records, shifts, seeds, f, label, "main" if label in ("source", "bn-adapt") else phase)
                if any(math.isnan(x) for x in per):
                    continue
                row[label] = {"mean": statistics.mean(per), "std": statistics.stdev(per) if len(per) > 1 else 0.0,
                              **{sh: statistics.mean(r["top1"] for r in records if r.get("label") == label
                                                     and r["shift"] == sh and math.isclose(r["fraction"], f)
                                                     and r["phase"] == ("main" if label in ("source", "bn-adapt")
                                                                        else phase))
                                 for sh in shifts}}
                if label != "bn-adapt" and not any(math.isnan(x) for x in bn):
                    vs_bn[mode].setdefault(str(f), {})[label] = paired(per, bn)
            cells[mode][str(f)] = row
            t = per_seed(records, shifts, seeds, f, "t3ar", phase)
            alone[mode][str(f)] = paired(t, per_seed(records, shifts, seeds, f, "t3ar-noretrieval", phase))
            vs_paper[mode][str(f)] = paired(t, per_seed(records, shifts, seeds, f, "t3ar-paper", phase))
    checks: list[dict[str, Any]] = []
    fa = str(p.ablation_fraction)
    if fa in vs_bn["test"] and "t3ar" in vs_bn["test"][fa]:
        d = vs_bn["test"][fa]["t3ar"]
        checks.append({"check": f"test-time {100 * p.ablation_fraction:g} %: validated T3AR − bn-adapt ≥ 3 points",
                       "value": d["mean"], "ci": [d["lo"], d["hi"]], "met": bool(d["mean"] >= 0.03)})
    for f in p.low_fractions:
        d = alone["test"][str(f)]
        checks.append({"check": f"test-time {100 * f:g} %: retrieval alone (validated T3AR − its retrieval-off twin) "
                                "≥ +1.5 points, 95 % CI above 0", "value": d["mean"], "ci": [d["lo"], d["hi"]],
                       "met": bool(d["mean"] >= 0.015 and d["lo"] > 0)})
    for f in p.train_fractions:
        if f in p.low_fractions and not math.isnan(alone["train"][str(f)]["mean"]):  # (its twin may be skipped)
            d = alone["train"][str(f)]
            checks.append({"check": f"train-time {100 * f:g} %: retrieval alone > 0, 95 % CI above 0",
                           "value": d["mean"], "ci": [d["lo"], d["hi"]], "met": bool(d["lo"] > 0)})
    for f in p.low_fractions:
        row = cells["test"][str(f)]
        others = {m: c["mean"] for m, c in row.items() if m not in ("t3ar", ORACLE, *LABEL_ARMS)}
        best = max(others, key=lambda m: others[m])
        gap = row["t3ar"]["mean"] - others[best]
        checks.append({"check": f"test-time {100 * f:g} %: validated T3AR ≥ the best other method ({best})",
                       "value": gap, "met": bool(gap >= 0)})
    below = [(m, f) for f in p.fractions for m, c in cells["test"][str(f)].items()
             if m not in ("source", ORACLE, ALL_ARM) and c["mean"] < cells["test"][str(f)]["source"]["mean"]]
    checks.append({"check": "no method below source-only on average", "value": below, "met": not below})
    t_below = [(sh, f) for f in p.fractions for sh in shifts
               if cells["test"][str(f)]["t3ar"][sh] < cells["test"][str(f)]["source"][sh]]
    checks.append({"check": "T3AR below source-only on no shift", "value": t_below, "met": not t_below})
    pool_data = {mode: {str(f): _pool_data(records, phases[mode], f) for f in fractions[mode]} for mode in phases}
    # what right labels on the neighbours would buy: the oracle diagnostic against the validated T3AR
    oracle = {str(f): paired(per_seed(records, shifts, seeds, f, ORACLE, "main"),
                             per_seed(records, shifts, seeds, f, "t3ar", "main"))
              for f in p.fractions if str(f) in cells["test"] and ORACLE in cells["test"][str(f)]}
    rule = (sel.get("winner_rule") or {}).get("chosen", "argmax")
    labelled: dict[str, Any] = {"goals": goals(p, records, rule)}
    if p.labelled:
        labelled["label_use"] = {mode: {str(f): label_use_summary(records, phases[mode], f) for f in fractions[mode]}
                                 for mode in phases}
    # label-free selection between bn-adapt and the default, leave-one-shift-out (t3ar_bench.method.label_free)
    free = leave_one_shift_out(selection_cells(records))
    return {"evaluation_shifts": shifts, "validation_shifts": list(validation_shifts(p)), **labelled,
            "label_free_selection": free, "label_free_verdict": verdict(free), "cells": cells, "vs_bn_adapt_all": vs_bn,
            "vs_bn_adapt": {m: {f: _ci(d["t3ar"]) for f, d in v.items() if "t3ar" in d} for m, v in vs_bn.items()},
            "retrieval_alone": {m: {f: _ci(d) for f, d in v.items()} for m, v in alone.items()},
            "retrieval_alone_paired": alone, "vs_paper": vs_paper, "oracle_vs_validated": oracle,
            "pool_data": pool_data,
            "retrieval_quality": {sh: q for sh, q in sel["quality"].items()},
            "verdict": {"met": all(c["met"] for c in checks), "checks": checks}}


def _pool_data(records: Sequence[Mapping[str, Any]], phase: str, f: float) -> dict[str, float]:
    """Neighbours as data in the validated T3AR's runs of one cell: served per step, of them with a known label
    per step, and the share of those rightly labelled (side labels: reporting only); NaN when off."""
    got = [r["pool_data"] for r in records if r.get("label") == "t3ar" and r["phase"] == phase
           and math.isclose(r["fraction"], f) and r.get("pool_data")]
    if not got:
        return {"per_step": math.nan, "known_per_step": math.nan, "correct_share": math.nan}
    right = [g["correct_share"] for g in got if not math.isnan(g["correct_share"])]
    return {"per_step": statistics.mean(g["per_step"] for g in got),
            "known_per_step": statistics.mean(g["known_per_step"] for g in got),
            "correct_share": statistics.mean(right) if right else math.nan}

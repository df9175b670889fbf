"""The method benchmark's driver: select on the validation shift, freeze, run the paired grid, summarise.

Phases: (1) learning rate per method on the validation shift (``select_fraction``, ``select_seeds``), and
the T3AR fidelity options there, each kept only if it beats the base on validation; (2) the main test-time
grid on the evaluation shifts with the frozen choices; (3) labelled ablations (each option flipped, k,
the oracle arm without same-class neighbours); (4) the train-time grid (labelled target). Nothing is
chosen by looking at evaluation images; the per-epoch pseudo-label accuracy uses the adapted images'
labels for the diagnostic curves only.
"""

from __future__ import annotations

import logging
import math
import os
import platform
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from t3ar_bench.method.plans import CONTRASTIVE, BenchPlan
from t3ar_bench.method.runs import Context, build_context, progress_log, run_all, source_record

log = logging.getLogger(__name__)


def _arm(phase: str, shift: str, seed: int, fraction: float, method: str, lr: float, **extra: Any) -> dict[str, Any]:
    return {"phase": phase, "shift": shift, "seed": seed, "fraction": fraction, "method": method, "lr": lr, **extra}


def _mean_top1(records: Sequence[Mapping[str, Any]], **match: Any) -> float:
    vals = [r["top1"] for r in records if all(r.get(k) == v for k, v in match.items())]
    return statistics.mean(vals) if vals else math.nan


def setting_label(setting: Mapping[str, float]) -> str:
    """A contrastive setting as the report names it ("default" for AdaptConfig's own)."""
    names = {"contrastive_weight": "weight", "temperature": "τ"}
    return ", ".join(f"{names.get(k, k)} {v:g}" for k, v in setting.items()) or "default"


def select(ctx: Context, cache: Path) -> dict[str, Any]:
    """Learning rates (per method and mode), then the T3AR family's contrastive setting (per method and mode, at its
    chosen lr), then the T3AR options (on top of both), chosen on the validation shift only."""
    p = ctx.plan
    v, f = p.validation_shift, p.select_fraction
    arms = [_arm("select", v, s, f, m, lr) for m in p.methods if m != "source" for lr in p.lr_grid
            for s in p.select_seeds]
    arms += [_arm("select-train", v, s, f, m, lr, mode="train") for m in p.train_methods for lr in p.lr_grid
             for s in p.select_seeds]
    recs = run_all(ctx, arms, cache)
    def best_lr(phase: str, method: str) -> float:
        return max(p.lr_grid, key=lambda lr: _mean_top1(recs, phase=phase, method=method, lr=lr))

    lrs = {m: best_lr("select", m) for m in p.methods if m != "source"}
    train_lrs = {m: best_lr("select-train", m) for m in p.train_methods}
    cands: list[dict[str, float]] = [{}, *(dict(c) for c in p.contrastive_settings)]  # the default first: ties
    families: list[tuple[str, str, float, dict[str, str]]] = [
        ("select", m, lrs[m], {}) for m in p.methods if m in CONTRASTIVE]
    families += [("select-train", m, train_lrs[m], {"mode": "train"}) for m in p.train_methods if m in CONTRASTIVE]
    c_arms = [_arm(phase, v, s, f, m, lr, options=c, **mode)
              for phase, m, lr, mode in families for c in cands[1:] for s in p.select_seeds]
    c_recs = run_all(ctx, c_arms, cache)

    def setting_top1(phase: str, method: str, lr: float, c: Mapping[str, float]) -> float:
        if not c:  # the default is the lr grid's own run
            return _mean_top1(recs, phase=phase, method=method, lr=lr)
        return _mean_top1(c_recs, phase=phase, method=method, options=dict(c))

    settings: dict[str, dict[str, dict[str, float]]] = {"select": {}, "select-train": {}}
    setting_table = []
    for phase, m, lr, _ in families:
        got = [setting_top1(phase, m, lr, c) for c in cands]
        best = max(range(len(cands)), key=lambda i: got[i])
        settings[phase][m] = cands[best]
        setting_table += [{"method": m, "mode": "train" if phase == "select-train" else "test", "lr": lr,
                           "setting": setting_label(c), "top1": got[i], "chosen": i == best}
                          for i, c in enumerate(cands)]
    t3ar_c = settings["select"].get("t3ar", {})
    base = setting_top1("select", "t3ar", lrs["t3ar"], t3ar_c)
    opt_arms = [_arm("select-option", v, s, f, "t3ar", lrs["t3ar"], options={name: value, **t3ar_c})
                for name, value in p.options for s in p.select_seeds]
    opt_recs = run_all(ctx, opt_arms, cache)
    chosen: dict[str, Any] = {}
    option_rows = []
    for name, value in p.options:
        got_opt = _mean_top1(opt_recs, method="t3ar", options={name: value, **t3ar_c})
        option_rows.append({"option": name, "value": value, "top1": got_opt, "base_top1": base,
                            "kept": got_opt > base})
        if got_opt > base:
            chosen[name] = value
    table = [{"method": m, "mode": "test", "lr": lr, "top1": _mean_top1(recs, phase="select", method=m, lr=lr)}
             for m in p.methods if m != "source" for lr in p.lr_grid]
    table += [{"method": m, "mode": "train", "lr": lr, "top1": _mean_top1(recs, phase="select-train", method=m, lr=lr)}
              for m in p.train_methods for lr in p.lr_grid]
    src = statistics.mean(source_record(ctx, v, s)["top1"] for s in p.select_seeds)
    return {"lr": lrs, "train_lr": train_lrs, "contrastive": settings["select"],
            "train_contrastive": settings["select-train"], "t3ar_options": chosen, "lr_table": table,
            "contrastive_table": setting_table, "options_table": option_rows, "source_top1": src, "shift": v,
            "fraction": f, "seeds": list(p.select_seeds)}


def run_drift_study(plan: BenchPlan, *, out_dir: Path, work: Path, cache: Path,
                    device: torch.device) -> dict[str, Any]:
    """Per-epoch curves of the contrastive methods at each lr of ``plan.lr_grid`` (see ``plans.DRIFT``)."""
    from t3ar_bench.method.report import write_drift_report

    t0 = time.perf_counter()
    ctx = build_context(plan, work, cache, device)
    arms = [_arm("drift", shift, seed, f, m, lr, curves=True, eval_curve=True)
            for shift in plan.eval_shifts for seed in plan.seeds for f in plan.fractions
            for m in plan.methods if m != "source" for lr in plan.lr_grid]
    records = run_all(ctx, arms, cache)
    sources = {f"{sh}/{s}": source_record(ctx, sh, s)["top1"] for sh in plan.eval_shifts for s in plan.seeds}
    res = {"plan": plan.as_dict(), "device": str(device), "records": records, "source_top1": sources,
           "minutes": (time.perf_counter() - t0) / 60,
           "n_adapt": {sh: len(ctx.targets[sh].adapt_idx) for sh in plan.eval_shifts}}
    write_drift_report(res, out_dir, stem=f"adaptation-{plan.name}")
    return res


def run_method_benchmark(plan: BenchPlan, *, out_dir: Path, work: Path, cache: Path,
                         device: torch.device) -> dict[str, Any]:
    """The grid protocol (:mod:`t3ar_bench.method.grid`): validation choices, the paired grid, the report."""
    from t3ar_bench.method.grid import grid_arms, select_design, summarise_grid
    from t3ar_bench.method.grid_report import write_grid_report

    t_start, load_start = time.perf_counter(), os.getloadavg()
    ctx = build_context(plan, work, cache, device)
    t_ctx = time.perf_counter() - t_start
    sel = select_design(ctx, cache)
    if plan.labelled:
        from t3ar_bench.method.labelled import select_labelled

        sel = select_labelled(ctx, cache, sel)
    log.info("validation choices: lr %s, train lr %s, bn-adapt groups %s, family term %s, R %s, T3AR options %s "
             "(validated %.4f vs paper-faithful %.4f)", sel["lr"], sel["train_lr"], sel["bn_groups"], sel["term"],
             sel["retriever"], sel["options"], sel["validated_top1"], sel["paper_top1"])
    arms = grid_arms(plan, sel)
    records = run_all(ctx, arms, cache, progress_log(len(arms)))
    for shift in plan.eval_shifts:
        for seed in plan.seeds:
            for f in plan.fractions:
                records.append({"phase": "main", "label": "source", "shift": shift, "seed": seed, "fraction": f,
                                "method": "source", **source_record(ctx, shift, seed, f)})
    summary = summarise_grid(plan, sel, records)
    targets = {s: {"adapt": len(t.adapt_idx), "eval": len(t.eval_idx), "classes": len(t.style.classes)}
               for s, t in ctx.targets.items()}
    results = {"plan": plan.as_dict(), "device": str(device),
               "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
               else f"{os.cpu_count()} CPU cores, {platform.machine()}",
               "machine": {"cpus": os.cpu_count(), "torch": torch.__version__, "loadavg_start": load_start,
                           "loadavg_end": os.getloadavg()},
               # each run's target predictions served the agreement criterion (in the summary): not kept
               "targets": targets, "selection": sel, **summary,
               "records": [{k: v for k, v in r.items() if k != "target_predictions"} for r in records],
               "minutes": {"context": t_ctx / 60, "total": (time.perf_counter() - t_start) / 60},
               "run_seconds_total": sum(float(r.get("seconds") or 0.0) for r in records),
               "runs_cached": sum(1 for r in records if r.get("cached")),
               "runs_executed": sum(1 for r in records if r.get("cached") is False)}
    write_grid_report(results, out_dir, stem=f"adaptation-{plan.name}")
    return results

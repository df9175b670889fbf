"""The contrastive-weight study (``t3ar bench adapt --plan weights``): a diagnostic; nothing is chosen from it.

Retrieval acts on T3AR through one term only: the retrieved images are negatives of its InfoNCE loss. This
study sweeps that term's weight (cross-entropy weight 1) for T3AR and T3AR without retrieval at the paper's
schedule, paired per (shift, seed), and reports two things per weight: how much the term moves accuracy
(against weight 0, the cross-entropy alone, where the pool has no effect and T3AR is its no-retrieval
variant) and what retrieval adds (T3AR − no retrieval). The validation shift is swept too, on the select
seeds: that is where the other plans choose the weight; the evaluation shifts only show what it does.
"""

from __future__ import annotations

import datetime as dt
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from t3ar.bench.method.plans import DEFAULT_WEIGHT, BenchPlan, paired
from t3ar.bench.method.report import ci, pct, pyplot, save_fig, write_results
from t3ar.bench.method.runs import build_context, progress_log, run_all, source_record

LABELS = {"t3ar-noretrieval": "T3AR without retrieval", "t3ar": "T3AR"}


def weight_arms(plan: BenchPlan) -> list[dict[str, Any]]:
    """Every (cell, weight, method) run: the validation shift on the select seeds (as the other plans' selection
    arms, so they share the run cache), the evaluation shifts on every seed. T3AR at weight 0 is left out:
    without the term the pool changes nothing, so it is the no-retrieval run."""
    lr, f = plan.lr_grid[0], plan.fractions[0]
    cells = [("select", plan.validation_shift, s) for s in plan.select_seeds]
    cells += [("weights", sh, s) for sh in plan.eval_shifts for s in plan.seeds]
    arms = []
    for phase, shift, seed in cells:
        for w in plan.contrastive_weights:
            for m in plan.methods:
                if m == "source" or (m == "t3ar" and w == 0):
                    continue
                opts = {} if w == DEFAULT_WEIGHT else {"options": {"contrastive_weight": w}}
                arms.append({"phase": phase, "shift": shift, "seed": seed, "fraction": f, "method": m, "lr": lr,
                             **opts})
    return arms


def _weight(r: Mapping[str, Any]) -> float:
    return float(r.get("options", {}).get("contrastive_weight", DEFAULT_WEIGHT))


def per_seed(records: Sequence[Mapping[str, Any]], shifts: Sequence[str], seeds: Sequence[int], method: str,
             weight: float) -> list[float]:
    """Per seed, the mean over ``shifts`` of ``method`` at ``weight`` (at weight 0 T3AR is its no-retrieval run)."""
    m = "t3ar-noretrieval" if weight == 0 else method
    out = []
    for s in seeds:
        vals = [r["top1"] for r in records
                if r["seed"] == s and r["shift"] in shifts and r["method"] == m and _weight(r) == weight]
        out.append(statistics.mean(vals) if len(vals) == len(shifts) else math.nan)
    return out


def summarise_weights(plan: BenchPlan, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per weight: each method's mean on the evaluation shifts, paired differences (T3AR − no retrieval; each
    method − the cross-entropy alone) and the validation means."""
    ev = [r for r in records if r["phase"] == "weights"]
    val = [r for r in records if r["phase"] == "select"]
    shifts, seeds = list(plan.eval_shifts), list(plan.seeds)
    methods = [m for m in plan.methods if m != "source"]
    ce = per_seed(ev, shifts, seeds, "t3ar-noretrieval", 0.0)
    rows = []
    for w in plan.contrastive_weights:
        row: dict[str, Any] = {"weight": w}
        for m in methods:
            per = per_seed(ev, shifts, seeds, m, w)
            row[m] = {"mean": statistics.mean(per), "per_shift": {
                sh: statistics.mean(per_seed(ev, [sh], seeds, m, w)) for sh in shifts},
                "validation": statistics.mean(per_seed(val, [plan.validation_shift], list(plan.select_seeds), m, w)),
                "minus_ce_only": paired(per, ce)}
        row["retrieval_gain"] = paired(per_seed(ev, shifts, seeds, "t3ar", w),
                                       per_seed(ev, shifts, seeds, "t3ar-noretrieval", w))
        rows.append(row)
    return {"rows": rows}


def run_weights_study(plan: BenchPlan, *, out_dir: Path, work: Path, cache: Path,
                      device: torch.device) -> dict[str, Any]:
    t0 = time.perf_counter()
    ctx = build_context(plan, work, cache, device)
    arms = weight_arms(plan)
    records = run_all(ctx, arms, cache, progress_log(len(arms), every=5))
    sources = {f"{sh}/{s}": source_record(ctx, sh, s)["top1"] for sh in plan.eval_shifts for s in plan.seeds}
    res = {"plan": plan.as_dict(), "device": str(device), "records": records, "source_top1": sources,
           "minutes": (time.perf_counter() - t0) / 60,
           "runs_executed": sum(1 for r in records if r.get("cached") is False),
           "n_adapt": {sh: len(ctx.targets[sh].adapt_idx) for sh in plan.eval_shifts},
           **summarise_weights(plan, records)}
    write_weights_report(res, out_dir, stem=f"adaptation-{plan.name}")
    return res


def _reading(res: Mapping[str, Any]) -> list[str]:
    """What the sweep says, in sentences computed from it."""
    rows = {r["weight"]: r for r in res["rows"]}
    out = []
    for w, r in rows.items():
        if w == 0:
            continue
        nr, t = r["t3ar-noretrieval"], r["t3ar"]
        out.append(f"- Weight {w:g}: the contrastive term moves T3AR without retrieval by {ci(nr['minus_ce_only'])} "
                   f"points against the cross-entropy alone, and T3AR by {ci(t['minus_ce_only'])}; retrieval adds "
                   f"{ci(r['retrieval_gain'])} (T3AR − T3AR without retrieval).")
    best = max(rows, key=lambda w: rows[w]["t3ar-noretrieval"]["validation"])
    out.append(f"- On the validation shift the no-retrieval variant is best at weight {best:g} of "
               f"{sorted(rows)}; the plans that choose the weight choose it there, from their own grid.")
    return out


def render_weights(res: Mapping[str, Any], stem: str) -> str:
    p = res["plan"]
    n = round(statistics.mean(res["n_adapt"].values()) * p["fractions"][0])
    src = statistics.mean(res["source_top1"].values())
    lines = ["# Contrastive-weight study: how much the term retrieval acts through moves accuracy", "",
             f"Generated by `t3ar bench adapt --plan weights` on {dt.date.today().isoformat()}, device "
             f"`{res['device']}`, {res['minutes']:.1f} min ({res['runs_executed']} runs executed). A **diagnostic**: "
             "the weight is swept on the evaluation shifts to show what it does; nothing is chosen from it (the "
             "`cpu` and `paper` plans choose it on the validation shift).", "",
             f"T3AR's retrieved images enter one term only, the InfoNCE loss (as negatives). Swept: its weight "
             f"(cross-entropy weight 1) for T3AR and T3AR without retrieval; at weight 0 the pool changes nothing, so "
             "T3AR is its no-retrieval run there. Evaluation shifts "
             f"{', '.join('google → ' + s for s in p['eval_shifts'])}, seeds {list(p['seeds'])}, "
             f"{100 * p['fractions'][0]:g} % of the adaptation part (~{n} images), "
             f"{p['epochs']} epochs, batch {p['batch_size']}, lr {p['lr_grid'][0]:g}, k = {p['k']}; paired per "
             f"(shift, seed): same source model, subset, batch order and views. Source only: {pct(src)} % (mean over "
             "the evaluation shifts).", "",
             "## Evaluation shifts (mean over shifts and seeds)", "",
             "| contrastive weight | T3AR without retrieval | T3AR | T3AR − no retrieval [95 % CI] | "
             "no retrieval − CE only | T3AR − CE only |", "|---|---|---|---|---|---|"]
    for r in res["rows"]:
        nr, t = r["t3ar-noretrieval"], r["t3ar"]
        lines.append(f"| {r['weight']:g} | {pct(nr['mean'])} | {pct(t['mean'])} | {ci(r['retrieval_gain'])} | "
                     f"{ci(nr['minus_ce_only'])} | {ci(t['minus_ce_only'])} |")
    lines += ["", "Per shift (mean over seeds; no retrieval / T3AR):", "",
              "| contrastive weight | " + " | ".join(p["eval_shifts"]) + " |", "|---|" + "---|" * len(p["eval_shifts"])]
    for r in res["rows"]:
        lines.append(f"| {r['weight']:g} | " + " | ".join(
            f"{pct(r['t3ar-noretrieval']['per_shift'][sh])} / {pct(r['t3ar']['per_shift'][sh])}"
            for sh in p["eval_shifts"]) + " |")
    lines += ["", f"## Validation shift (google → {p['validation_shift']}, seeds {list(p['select_seeds'])})", "",
              "| contrastive weight | T3AR without retrieval | T3AR |", "|---|---|---|"]
    lines += [f"| {r['weight']:g} | {pct(r['t3ar-noretrieval']['validation'])} | {pct(r['t3ar']['validation'])} |"
              for r in res["rows"]]
    lines += ["", "## Reading", "", *_reading(res), "",
              f"Plot: `{stem}.png`. Every run is in `{stem}.json`.", ""]
    return "\n".join(lines)


def write_weights_report(res: Mapping[str, Any], out_dir: Path, *, stem: str) -> None:
    write_results(res, render_weights(res, stem), out_dir, stem)
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ws = [r["weight"] for r in res["rows"]]
    for m, colour in (("t3ar-noretrieval", "tab:blue"), ("t3ar", "tab:red")):
        ax.plot(ws, [100 * r[m]["mean"] for r in res["rows"]], "o-", color=colour, label=LABELS[m])
    ax.axhline(100 * statistics.mean(res["source_top1"].values()), color="grey", linestyle=":", label="source only")
    ax.set_xlabel("contrastive weight (0 = cross-entropy only)")
    ax.set_ylabel("top-1 (%), evaluation shifts")
    ax.legend(fontsize=7)
    save_fig(plt, fig, out_dir / f"{stem}.png")

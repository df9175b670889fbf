"""The contrastive-term study (``t3ar bench adapt --plan contrastive``): a diagnostic of the one term retrieval
acts through.

T3AR's retrieved images enter its loss in one place only: as negatives of the InfoNCE term. On every evaluation
shift, paired per (shift, seed) (same source model, subset, batch order and views), this study measures how much
that term moves accuracy (against the family's cross-entropy alone, where the pool has no effect) and what
retrieval adds (T3AR − T3AR without retrieval), with the term at AdaptConfig's defaults and as the validation
shift chose it (:func:`t3ar_bench.method.main.select`, the choice every plan makes). Nothing is chosen from the
evaluation shifts.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from t3ar_bench.method.main import select, setting_label
from t3ar_bench.method.plans import BenchPlan, paired
from t3ar_bench.method.report import ci, pct, pyplot, save_fig, write_results
from t3ar_bench.method.runs import build_context, progress_log, run_all, source_record

log = logging.getLogger(__name__)
NORET = "t3ar-noretrieval"
CE_ONLY_OPTIONS = {"contrastive_weight": 0.0}


def terms(sel: Mapping[str, Any]) -> dict[str, tuple[dict[str, float], dict[str, float]]]:
    """The compared settings of the term, as (no retrieval's, T3AR's): both at the defaults; each as validation
    chose it (the frozen comparison); both at T3AR's choice (retrieval alone differs)."""
    choice = sel["contrastive"]
    return {"default": ({}, {}), "chosen": (dict(choice[NORET]), dict(choice["t3ar"])),
            "t3ar_choice": (dict(choice["t3ar"]), dict(choice["t3ar"]))}


TERM_NAMES = {"default": "Default", "chosen": "Validation's choice", "t3ar_choice": "T3AR's choice for both"}


def study_arms(plan: BenchPlan, sel: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per evaluation (shift, seed): the cross-entropy alone (the no-retrieval run at weight 0: without the term
    the pool changes nothing) and both methods at every compared setting (:func:`terms`), each distinct run once."""
    f = plan.fractions[0]
    arms: dict[str, dict[str, Any]] = {}
    todo: list[tuple[str, Mapping[str, float]]] = [(NORET, CE_ONLY_OPTIONS)]
    for noret_opts, t3ar_opts in terms(sel).values():
        todo += [(NORET, noret_opts), ("t3ar", t3ar_opts)]
    for shift in plan.eval_shifts:
        for seed in plan.seeds:
            for m, opts in todo:
                arm = {"phase": "contrastive", "shift": shift, "seed": seed, "fraction": f, "method": m,
                       "lr": sel["lr"][m], **({"options": dict(opts)} if opts else {})}
                arms[json.dumps(arm, sort_keys=True)] = arm
    return list(arms.values())


def per_seed(records: Sequence[Mapping[str, Any]], shifts: Sequence[str], seeds: Sequence[int], method: str,
             options: Mapping[str, float]) -> list[float]:
    """Per seed, the mean over ``shifts`` of ``method``'s runs with exactly ``options``."""
    out = []
    for s in seeds:
        vals = [r["top1"] for r in records if r["seed"] == s and r["shift"] in shifts and r["method"] == method
                and r.get("options", {}) == dict(options)]
        out.append(statistics.mean(vals) if len(vals) == len(shifts) else math.nan)
    return out


def summarise_study(plan: BenchPlan, sel: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The cross-entropy alone, then per compared setting (:func:`terms`) each method's mean, its paired difference
    to the cross-entropy alone, what retrieval adds (T3AR − no retrieval), and the same per shift."""
    shifts, seeds = list(plan.eval_shifts), list(plan.seeds)
    ce = per_seed(records, shifts, seeds, NORET, CE_ONLY_OPTIONS)
    out: dict[str, Any] = {"ce_only": {"mean": statistics.mean(ce), "per_shift": {
        sh: statistics.mean(per_seed(records, [sh], seeds, NORET, CE_ONLY_OPTIONS)) for sh in shifts}}}
    for term, (noret_opts, t3ar_opts) in terms(sel).items():
        row: dict[str, Any] = {}
        per: dict[str, list[float]] = {}
        for m, opts in ((NORET, noret_opts), ("t3ar", t3ar_opts)):
            per[m] = per_seed(records, shifts, seeds, m, opts)
            row[m] = {"setting": setting_label(opts), "mean": statistics.mean(per[m]),
                      "minus_ce_only": paired(per[m], ce),
                      "per_shift": {sh: statistics.mean(per_seed(records, [sh], seeds, m, opts)) for sh in shifts}}
        row["retrieval_gain"] = paired(per["t3ar"], per[NORET])
        out[term] = row
    return out


def run_contrastive_study(plan: BenchPlan, *, out_dir: Path, work: Path, cache: Path,
                          device: torch.device) -> dict[str, Any]:
    t0 = time.perf_counter()
    ctx = build_context(plan, work, cache, device)
    sel = select(ctx, cache)
    log.info("validation choices: lr %s, contrastive setting %s", sel["lr"], sel["contrastive"])
    arms = study_arms(plan, sel)
    records = run_all(ctx, arms, cache, progress_log(len(arms), every=5))
    sources = {f"{sh}/{s}": source_record(ctx, sh, s)["top1"] for sh in plan.eval_shifts for s in plan.seeds}
    res = {"plan": plan.as_dict(), "device": str(device), "selection": sel, "records": records,
           "source_top1": sources, "minutes": (time.perf_counter() - t0) / 60,
           "runs_executed": sum(1 for r in records if r.get("cached") is False),
           "n_adapt": {sh: len(ctx.targets[sh].adapt_idx) for sh in plan.eval_shifts},
           **summarise_study(plan, sel, records)}
    write_contrastive_report(res, out_dir, stem=f"adaptation-{plan.name}")
    return res


def _reading(res: Mapping[str, Any]) -> list[str]:
    """What the study says, in sentences computed from it."""
    out = []
    for term, name in TERM_NAMES.items():
        r = res[term]
        out.append(f"- {name} (no retrieval: {r[NORET]['setting']}; T3AR: {r['t3ar']['setting']}): the "
                   f"term moves T3AR without retrieval by {ci(r[NORET]['minus_ce_only'])} points against the "
                   f"cross-entropy alone and T3AR by {ci(r['t3ar']['minus_ce_only'])}; retrieval adds "
                   f"{ci(r['retrieval_gain'])} (T3AR − T3AR without retrieval, 95 % CI).")
    for term, name in TERM_NAMES.items():
        g = res[term]["retrieval_gain"]
        verdict = "above 0" if g["lo"] > 0 else ("below 0" if g["hi"] < 0 else "spans 0")
        out.append(f"- {name}: the 95 % CI of what retrieval adds {verdict}.")
    return out


def render_contrastive(res: Mapping[str, Any], stem: str) -> str:
    p, sel = res["plan"], res["selection"]
    n = round(statistics.mean(res["n_adapt"].values()) * p["fractions"][0])
    src = statistics.mean(res["source_top1"].values())
    lines = ["# Contrastive-term study: the one term retrieval acts through", "",
             f"Generated by `t3ar bench adapt --plan contrastive` on {dt.date.today().isoformat()}, device "
             f"`{res['device']}`, {res['minutes']:.1f} min ({res['runs_executed']} of {len(res['records'])} runs "
             f"executed, the rest from the run cache; the runs' own time adds up to "
             f"{sum(r['seconds'] for r in res['records']) / 60:.0f} min, 2 processes on 2 cores). A **diagnostic**: "
             "the term's setting is chosen on the validation shift (as every plan chooses it); the evaluation "
             "shifts only show what it does.", "",
             "T3AR's retrieved images enter one term only, the InfoNCE loss (as negatives). Compared, paired per "
             "(shift, seed) (same source model, subset, batch order and views): the family's cross-entropy alone "
             "(weight 0: the pool changes nothing there), and T3AR and T3AR without retrieval with the term at its "
             "defaults (weight 1, τ 0.07), each as validation chose it (the frozen comparison), and both at T3AR's "
             "choice (only retrieval differs). Evaluation shifts "
             f"{', '.join('google → ' + s for s in p['eval_shifts'])}, seeds {list(p['seeds'])}, "
             f"{100 * p['fractions'][0]:g} % of the adaptation part (~{n} images), {p['epochs']} epochs, batch "
             f"{p['batch_size']}, lr {p['lr_grid'][0]:g}, k = {p['k']}. Source only: {pct(src)} % (mean over the "
             "evaluation shifts).", "",
             f"## The choice on the validation shift (google → {p['validation_shift']}, seeds "
             f"{list(p['select_seeds'])}, {100 * p['select_fraction']:g} %)", "",
             "| method | " + " | ".join(dict.fromkeys(r["setting"] for r in sel["contrastive_table"])) + " | chosen |",
             "|---|" + "---|" * (len(dict.fromkeys(r["setting"] for r in sel["contrastive_table"])) + 1)]
    for m in (NORET, "t3ar"):
        rows = [r for r in sel["contrastive_table"] if r["method"] == m]
        lines.append(f"| {m} | " + " | ".join(pct(r["top1"]) for r in rows) + " | "
                     + next(r["setting"] for r in rows if r["chosen"]) + " |")
    lines += ["", "## Evaluation shifts (mean over shifts and seeds; paired differences in points, 95 % CI)", "",
              "| term | T3AR without retrieval | T3AR | T3AR − no retrieval | no retrieval − CE only | "
              "T3AR − CE only |", "|---|---|---|---|---|---|",
              f"| cross-entropy only | {pct(res['ce_only']['mean'])} | = | | | |"]
    for term, name in TERM_NAMES.items():
        r = res[term]
        lines.append(f"| {name} ({r[NORET]['setting']} / {r['t3ar']['setting']}) | {pct(r[NORET]['mean'])} | "
                     f"{pct(r['t3ar']['mean'])} | {ci(r['retrieval_gain'])} | {ci(r[NORET]['minus_ce_only'])} | "
                     f"{ci(r['t3ar']['minus_ce_only'])} |")
    lines += ["", "Per shift (mean over seeds):", "", "| term | method | " + " | ".join(p["eval_shifts"]) + " |",
              "|---|---|" + "---|" * len(p["eval_shifts"]),
              "| cross-entropy only | | " + " | ".join(pct(res["ce_only"]["per_shift"][sh]) for sh in p["eval_shifts"])
              + " |"]
    for term, name in TERM_NAMES.items():
        for m in (NORET, "t3ar"):
            lines.append(f"| {name} | {m} | "
                         + " | ".join(pct(res[term][m]["per_shift"][sh]) for sh in p["eval_shifts"]) + " |")
    lines += ["", "## Reading", "", *_reading(res), "", f"Plot: `{stem}.png`. Every run is in `{stem}.json`.", ""]
    return "\n".join(lines)


def write_contrastive_report(res: Mapping[str, Any], out_dir: Path, *, stem: str) -> None:
    write_results(res, render_contrastive(res, stem), out_dir, stem)
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 3.6))
    names, vals, colours = ["CE only"], [res["ce_only"]["mean"]], ["grey"]
    for term, name in TERM_NAMES.items():
        for m, colour, short in ((NORET, "tab:blue", "no retrieval"), ("t3ar", "tab:red", "T3AR")):
            names.append(f"{name}\n{short}\n({res[term][m]['setting']})")
            vals.append(res[term][m]["mean"])
            colours.append(colour)
    src = 100 * statistics.mean(res["source_top1"].values())
    ax.bar(range(len(vals)), [100 * v for v in vals], color=colours)
    ax.set_xticks(range(len(vals)), names, fontsize=5)
    ax.axhline(src, color="black", linestyle=":", label="source only")
    ax.set_ylim(max(0.0, min(src, *(100 * v for v in vals)) - 5), None)
    ax.set_ylabel("top-1 (%), evaluation shifts")
    ax.legend(fontsize=7)
    save_fig(plt, fig, out_dir / f"{stem}.png")

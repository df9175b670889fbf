"""The adaptation benchmark's report: ``<stem>.md``, ``<stem>.json`` and the PNG plots."""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from t3ar.bench.adaptation_plots import LABELS, plot_fractions, plot_retrievals
from t3ar.bench.adaptation_protocol import aggregate, lookup
from t3ar.bench.adaptation_report_text import ablation_records, cell, pct, protocol_lines, pts, why_lines

log = logging.getLogger(__name__)


def _pc(x: float) -> str:
    return "–" if math.isnan(x) else f"{pct(x)} %"


def _reused_lines(results: Mapping[str, Any]) -> list[str]:
    """What this invocation took from the caches (not in its total), with what it cost when it was computed."""
    src = [f"seed {s}: {float(m.get('seconds', 0)):.0f} s" for s, m in results["source_models"].items()
           if m.get("reused")]
    emb = float((results.get("timings_reused_from_cache") or {}).get("embeddings", 0.0))
    runs = results["runs_reused"]
    if not (src or emb or runs):
        return []
    parts = [f"source models trained earlier ({', '.join(src)})" if src else "",
             f"pool/query embeddings computed earlier ({emb:.0f} s)" if emb else
             ("pool/query embeddings computed earlier" if src else ""),
             f"{runs} adaptation runs from the run cache" if runs else ""]
    return ["", "Reused from the caches under the work dir and not included in the total above: "
            + "; ".join(p for p in parts if p) + "."]


def _grid_epochs(results: Mapping[str, Any]) -> list[str]:
    """Seconds per epoch at 100 % of T in the main grid (includes per-run set-up such as the bank init)."""
    per: dict[str, list[float]] = {}
    for r in results["records"]:
        if r["variant"] == "main" and r["method"] != "source" and math.isclose(r["fraction"], 1.0):
            per.setdefault(r["method"], []).append(float(r["seconds_per_epoch"]))
    if not per:
        return []
    return ["- Seconds per epoch over the whole adaptation part in the main-grid runs (mean over runs, incl. "
            "set-up such as the bank initialisation): " + ", ".join(
                f"{LABELS.get(m, m)} {statistics.mean(v):.0f} s" for m, v in per.items()) + "."]


def _diag_section(results: Mapping[str, Any]) -> tuple[list[str], dict[str, float]]:
    diag = results["diagnostics"]
    k_cand = max(d["depth"] for d in diag) if diag else 0
    keyf = ("known_fraction", "same_label_fraction", "same_item_fraction", "queries_with_same_label",
            "chance_same_label")
    groups: dict[tuple[str, bool, int], list[Mapping[str, Any]]] = {}
    for d in diag:
        groups.setdefault((d["retriever"], d["pool_with_emoji"], d["depth"]), []).append(d)
    out = ["Queries: every image of the adaptation part (100 %), neighbours by inner product of R's embeddings "
           f"(top-1 and the top r·k = {k_cand} candidates that dedup samples from). Only neighbours from the other "
           "emoji styles have a known subcategory (side table from the emoji kit); clipart has none.", "",
           "| retriever | pool | depth | from emoji styles | same subcategory (of known) | same emoji (of known) "
           "| queries with ≥1 same-subcategory | chance same subcategory |", "|---|---|---|---|---|---|---|---|"]
    avg: dict[tuple[str, bool, int], dict[str, float]] = {}
    order = {"imagenet": 0, "random-init": 1, "clip": 2}
    for (ret, emo, depth), ds in sorted(groups.items(), key=lambda kv: (order.get(kv[0][0], 9), kv[0][0],
                                                                         not kv[0][1], kv[0][2])):
        vals = {k: statistics.mean(float(d[k]) for d in ds if not math.isnan(float(d[k])))
                if any(not math.isnan(float(d[k])) for d in ds) else math.nan for k in keyf}
        avg[(ret, emo, depth)] = vals
        out.append(f"| {ret} | {'with emoji' if emo else 'clipart only'} | {depth} | "
                   + " | ".join(_pc(vals[key]) for key in keyf) + " |")
    per_shift = [d for d in diag if d["retriever"] == "imagenet" and d["pool_with_emoji"] and d["depth"] == k_cand]
    if len(per_shift) > 1:
        out += ["", f"Per shift (ImageNet R, pool with emoji, top {k_cand}): " + "; ".join(
            f"{d['shift']}: {pct(d['same_label_fraction'])} % same subcategory, {pct(d['same_item_fraction'])} % "
            f"same emoji, sources " + ", ".join(f"{s} {pct(v, 0)} %" for s, v in d["sources"].items())
            for d in per_shift) + "."]
    main = avg.get(("imagenet", True, k_cand), {})
    return out, {k: main.get(k, math.nan) for k in keyf}


def render(results: Mapping[str, Any], stem: str) -> str:
    plan, rows, v = results["plan"], results["aggregate"], results["verdict"]
    fr, methods, shifts = plan["fractions"], plan["methods"], plan["shifts"]
    t = results["timings"]
    load = results["machine"]["loadavg_start"]
    shared = max(load[1], results["machine"]["loadavg_end"][1]) > 1.2
    lines = ["# Adaptation benchmark: does retrieval help when target data is scarce? (issue 5)", "",
             f"Generated by `t3ar bench adapt{' --quick' if results['quick'] else ''}` on "
             f"{dt.date.today().isoformat()}; device `{results['device']}`, {results['machine']['cpus']} CPUs; "
             f"**{t['total'] / 60:.1f} min** in total ({results['runs_executed']} adaptations run, "
             f"{results['runs_reused']} reused from the run cache). Load average at start/end "
             f"{load[1]:.1f} / {results['machine']['loadavg_end'][1]:.1f} (1-min/5-min from the OS): "
             + ("**the machine was shared with other jobs, so absolute times are inflated**." if shared else
                "the machine was not noticeably shared.")]
    if results["quick"]:
        lines += ["", "> **Quick smoke run**: 1 shift, 1 seed, capped sets and a few steps. These numbers only show "
                      "that the pipeline works; they are not the benchmark's results."]
    lines += ["", "## Verdict", ""]
    if v["met"] is None:
        lines.append("**Goal not evaluated**: a fraction it needs was not run.")
    else:
        lines.append(f"**The goal was {'met' if v['met'] else 'NOT met'}** (T3AR ≥ best baseline + 3 points at 1 % "
                     "and 10 % of T, averaged over the shifts, and not below T3AR without retrieval at 100 %):")
    for c in v["checks"]:
        if c["met"] is None:
            continue
        if c["kind"] == "low":
            lines.append(f"- {100 * c['fraction']:g} %: T3AR {pct(c['t3ar'])} vs best baseline "
                         f"{LABELS.get(c['best_baseline'], c['best_baseline'])} {pct(c['best_baseline_mean'])}: "
                         f"{pts(c['gap'])} points (needed +3.0) — {'met' if c['met'] else 'not met'}.")
        else:
            lines.append(f"- {100 * c['fraction']:g} %: T3AR {pct(c['t3ar'])} vs T3AR without retrieval "
                         f"{pct(c['t3ar-noretrieval'])}: {pts(c['gap'])} points (needed ≥ 0) — "
                         f"{'met' if c['met'] else 'not met'}.")
    diag_lines, dmain = _diag_section(results)
    lines += ["", "Why, in numbers:", *why_lines(results, dmain)]
    lines += ["", "## Protocol", *protocol_lines(results)]
    lines += ["", "## Results", "", "Top-1 accuracy (%) on the held-out evaluation part, mean ± std over seeds "
              "(sample std of each seed's shift average).", "", "| method | " + " | ".join(
                  f"{100 * f:g} % of T" for f in fr) + " |", "|---|" + "---|" * len(fr)]
    for m in methods:
        lines.append(f"| {LABELS.get(m, m)} | " + " | ".join(
            cell(lookup(rows, variant="main", method=m, fraction=f)) for f in fr) + " |")
    lines += ["", f"![accuracy vs fraction]({stem}_fraction.png)"]
    for f in fr:
        lines += ["", f"Per shift, {100 * f:g} % of T:", "", "| method | " + " | ".join(shifts) + " |",
                  "|---|" + "---|" * len(shifts)]
        for m in methods:
            lines.append(f"| {LABELS.get(m, m)} | " + " | ".join(
                cell(lookup(rows, variant="main", method=m, fraction=f, shift=s)) for s in shifts) + " |")
    recs, entries = ablation_records(results)
    abl, same = aggregate(recs), aggregate(recs, metric="same")
    lines += ["", "## Ablations", "", f"T3AR at {100 * plan['ablation_fraction']:g} % of T, seed(s) "
              f"{', '.join(map(str, plan['ablation_seeds']))}, averaged over the shifts (the k = {plan['k']}, random "
              "and T3AR-without-retrieval cells are the main-grid runs of those seeds). 'Same subcat.' = share of the "
              "sampled "
              "neighbours (negatives) of known label that have the query's subcategory.", "",
              "| ablation | setting | top-1 | same subcat. |",
              "|---|---|---|---|"]
    for group, label, key in entries:
        row = lookup(abl, variant="ablation", method=key, fraction=plan["ablation_fraction"])
        if row is None:
            continue
        srow = lookup(same, variant="ablation", method=key, fraction=plan["ablation_fraction"])
        lines.append(f"| {group} | {label} | {cell(row)} | {pct(srow['mean']) if srow else '–'} |")
    lines += ["", f"![accuracy vs retrievals]({stem}_retrievals.png)", "", "## Retrieval diagnostics", "",
              *diag_lines, "", "## Speed", "",
              "Step speed is measured by `t3ar bench speed`: see [speed.md](speed.md).", *_grid_epochs(results),
              "", "## Time spent", "",
              "| phase | seconds |", "|---|---|", *[f"| {k} | {val:.0f} |" for k, val in t.items()],
              *_reused_lines(results),
              "", f"Every run (config, steps, timings, accuracy, neighbour diagnostics) is in `{stem}.json`."]
    return "\n".join(lines) + "\n"


def write_report(results: dict[str, Any], out_dir: Path, *, stem: str) -> None:
    """Write ``<stem>.json`` (everything), the plots and ``<stem>.md`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps(results, indent=1, sort_keys=False, default=str) + "\n")
    plan, rows = results["plan"], results["aggregate"]
    try:
        plot_fractions(rows, plan["methods"], plan["fractions"], plan["shifts"], out_dir / f"{stem}_fraction.png")
        recs, entries = ablation_records(results)
        abl = aggregate(recs)
        keys = [key for group, _, key in entries if group == "retrievals"]
        labels = [label.split(" ")[0] for group, label, _ in entries if group == "retrievals"]
        f = plan["ablation_fraction"]
        points = [(lab, lookup(abl, variant="ablation", method=key, fraction=f)) for lab, key in
                  zip(labels, keys, strict=True)]
        per_shift = {s: [(r["mean"] if (r := lookup(abl, variant="ablation", method=key, fraction=f, shift=s))
                          else None) for key in keys] for s in plan["shifts"]} if len(plan["shifts"]) > 1 else {}
        plot_retrievals(points, per_shift, f, out_dir / f"{stem}_retrievals.png")
    except ModuleNotFoundError as exc:  # matplotlib is the optional `plots` extra
        log.warning("no plots (%s): pip install 't3ar[plots]'", exc)
    (out_dir / f"{stem}.md").write_text(render(results, stem))
    log.info("wrote %s/%s.{md,json,_*.png}", out_dir, stem)

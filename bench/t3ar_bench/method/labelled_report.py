"""The labelled-pool protocol's part of the method benchmark's report (:mod:`t3ar_bench.method.labelled`): the
goals in points, the choices made on validation, the product's default, what the labelled arms trained on."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from t3ar_bench.markdown import table
from t3ar_bench.method.labelled import ALL_ARM, LABELS_ARM, RANDOM_ARM
from t3ar_bench.method.report import pct, pyplot, save_fig

NAMES = {LABELS_ARM: "**T3AR with the labelled pool** (retrieved labelled neighbours as data)",
         RANDOM_ARM: "random-labelled control (as many labelled pool items per step, drawn at random)",
         ALL_ARM: "whole labelled pool mixed in (reference)"}
COLOURS = {LABELS_ARM: ("tab:olive", "-"), RANDOM_ARM: ("tab:gray", "-."), ALL_ARM: ("tab:brown", ":")}
GOAL_ROWS = (("accepted_vs_bn_adapt", "accepted (holdout winner) − bn-adapt"),
             ("accepted_vs_source", "accepted (holdout winner) − source"),
             ("accepted_vs_hindsight", "accepted (holdout winner) − the best candidate per shift in hindsight"),
             ("no_harm", "validated T3AR (unlabelled pool) − bn-adapt"),
             ("labelled_vs_random", "T3AR with the labelled pool − its random-labelled control"),
             ("labelled_vs_bn_adapt", "T3AR with the labelled pool − bn-adapt"),
             ("labelled_vs_adacontrast", "T3AR with the labelled pool − AdaContrast"),
             ("labelled_vs_unlabelled", "T3AR with the labelled pool − validated T3AR (same pool, no labels)"),
             ("labelled_vs_supervised", "T3AR with the labelled pool − supervised fine-tuning"),
             ("all_vs_labelled", "whole labelled pool − T3AR with the labelled pool"))


def _pts(d: Mapping[str, float] | None) -> str:
    if not d:
        return "–"
    lo, hi = d["lo"], d["hi"]
    ci = "" if (lo is None or math.isnan(lo)) else f" [{lo:+.1f}, {hi:+.1f}]"
    return f"{d['mean']:+.1f}{ci}"


def goals_section(res: Mapping[str, Any]) -> list[str]:
    g = res.get("goals")
    if not g:
        return []
    rows = [[name, mode, f"{100 * float(f):g} %", _pts(d)]
            for key, name in GOAL_ROWS for mode, by_f in g.get(key, {}).items() for f, d in by_f.items()]
    out = ["Paired differences in **points** (mean over the evaluation cells, shift x seed [95 % CI over them]):", "",
           *table(["comparison", "mode", "fraction", "difference"], rows), "", "Goals:", ""]
    for c in g["checks"]:
        met = {True: "met", False: "NOT met", None: "not measured"}[c["met"]]
        val = "–" if c["value"] is None else (f"{c['value']:+.1f} points" + (
            f", 95 % CI [{c['ci'][0]:+.1f}, {c['ci'][1]:+.1f}]" if c.get("ci") and not math.isnan(c["ci"][0]) else ""))
        out.append(f"- {c['check']}: {val} — {met}")
    return out


def option_table(rows: list[Mapping[str, Any]]) -> list[str]:
    """The options a greedy selection tried, in order: each one's top-1, the best before it and whether it stayed."""
    return table(["option", "top-1 with it", "best before", "kept"],
                 ([r["option"], pct(r["top1"]), pct(r["base_top1"]), "yes" if r["kept"] else "no"] for r in rows))


def selection_section(res: Mapping[str, Any]) -> list[str]:
    sel = res["selection"]
    if "no_harm_table" not in sel:
        return []
    d = sel["default"]
    tops = ", ".join(f"{m} {pct(t)} %" for m, t in d["validation_top1"].items())
    lab = sel["labelled"]
    return ["", "### No harm: the family's BatchNorm, lr, second-stage and soft k-NN voting options", "",
            "Greedily on top of the validated T3AR (unlabelled pool), each kept only if it beats the best so far; the "
            "kept ones apply to every family arm but the paper-faithful one (T3AR without retrieval stays the "
            "validated T3AR's retrieval-off twin):", "", *option_table(sel["no_harm_table"]), "",
            f"**The product's default job method: `{d['method']}`** ({d['rule']}; on validation: {tops}).", "",
            "### Labelled neighbours as data", "",
            "On the validated T3AR with the pool's labels (retrieved neighbours whose label is one of the model's "
            "classes train with it), from weight 1; train time takes the same options:", "",
            *option_table(lab["table"]), "",
            f"Frozen: {', '.join(f'{k} {v}' for k, v in lab['options'].items())} ({pct(lab['top1'])} % on "
            f"validation, {100 * lab['gain_on_validation']:+.1f} points over the validated T3AR without labels)."]


def use_section(res: Mapping[str, Any]) -> list[str]:
    use = res.get("label_use")
    if not use:
        return []
    rows = [[mode, f"{100 * float(f):g} %", NAMES[arm], f"{d['per_step']:.1f}", f"{d['distinct']:.0f}",
             f"{pct(d['query_class_share'])} %",
             ", ".join(f"{s} {100 * v:.0f} %" for s, v in sorted(d["style_share"].items(), key=lambda kv: -kv[1]))]
            for mode, by_f in use.items() for f, arms in by_f.items() for arm, d in arms.items()]
    return ["What the labelled arms trained on (means over their runs): labelled pool items per step, distinct items "
            "per run, the share whose label is a retrieving query's class (random and whole-pool draws: a class of "
            "the adapted subset), and the share of the uses from each pool style:", "",
            *table(["mode", "fraction", "arm", "per step", "distinct", "query's class", "styles"], rows)]


def goals_plot(res: Mapping[str, Any], out_dir: Path, stem: str) -> None:
    """``<stem>-goals.png``: every goal's paired difference in points with its 95 % CI."""
    g = res.get("goals")
    plt = pyplot()
    if plt is None or not g:
        return
    rows = [(f"{name} ({mode}, {100 * float(f):g} %)", d) for key, name in GOAL_ROWS
            for mode, by_f in g.get(key, {}).items() for f, d in by_f.items()]
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(rows) + 1.2))
    for i, (_, d) in enumerate(rows):
        lo, hi = d["lo"], d["hi"]
        if lo is not None and not math.isnan(lo):
            ax.plot([lo, hi], [i, i], color="tab:blue")
        ax.plot([d["mean"]], [i], "o", color="tab:blue")
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("paired difference (points), 95 % CI over shifts x seeds")
    save_fig(plt, fig, out_dir / f"{stem}-goals.png")

"""The acceptance round's part of the method benchmark's report: the goals per shift, the acceptance winners and
holdout-size curve (:mod:`t3ar_bench.method.goals`), label-free selection (:mod:`t3ar_bench.method.label_free`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from t3ar_bench.markdown import table
from t3ar_bench.method.labelled_report import GOAL_ROWS

ACCEPTANCE_GOALS = ("accepted_vs_bn_adapt", "accepted_vs_source", "accepted_vs_hindsight")
CRITERION_NAMES = {"entropy": "entropy (minus the mean prediction entropy)",
                   "im": "information maximisation (marginal − mean entropy)",
                   "agreement": "agreement with bn-adapt", "snd": "soft neighbourhood density (softmax outputs)",
                   "snd_features": "soft neighbourhood density (bottleneck features)"}


def _v(x: float | None) -> str:
    return "–" if x is None or math.isnan(x) else f"{x:+.1f}"


def _ci(d: Mapping[str, Any] | None) -> str:
    if not d:
        return "–"
    lo = d["lo"]
    return _v(d["mean"]) + ("" if lo is None or math.isnan(lo) else f" [{lo:+.1f}, {d['hi']:+.1f}]")


def _share(x: float) -> str:
    return "–" if math.isnan(x) else f"{100 * x:.0f} %"


def per_shift_section(res: Mapping[str, Any]) -> list[str]:
    """Every goal with a per-shift breakdown: a row per (goal, mode, fraction), a column per shift (points)."""
    g, shifts = res.get("goals") or {}, res.get("evaluation_shifts") or res["plan"]["eval_shifts"]
    rows = [[name, mode, f"{100 * float(f):g} %", _ci(d), *(_v(d["per_shift"].get(s)) for s in shifts)]
            for key, name in GOAL_ROWS for mode, by_f in (g.get(key) or {}).items() for f, d in by_f.items()
            if d.get("per_shift")]
    if not rows:
        return []
    return ["Per shift (points, mean over seeds):", "",
            *table(["comparison", "mode", "fraction", "all [95 % CI]", *shifts], rows)]


def acceptance_section(res: Mapping[str, Any]) -> list[str]:
    """How often each candidate won its cell's holdout, and the three acceptance goals per holdout size."""
    curve = (res.get("goals") or {}).get("acceptance_curve") or {}
    if not any(c["accepted_vs_bn_adapt"]["test"] for c in curve.values()):
        return []
    rule = (res.get("goals") or {}).get("acceptance_rule", "argmax")
    how = ("the best top-1 (a tie goes to the simpler candidate)" if rule == "argmax" else
           "the simpler candidate unless a paired bootstrap CI on the holdout favours another")
    rows = [[k, f"{100 * float(f):g} %", " / ".join(str(wins.get(m, 0)) for m in ("source", "bn-adapt", "t3ar")),
             *(_ci(c[g]["test"].get(f)) for g in ACCEPTANCE_GOALS)]
            for k, c in curve.items() for f, wins in c["wins"].items()]
    return [*winner_rule_lines(res), f"The accepted model of a cell is the candidate (source, bn-adapt, the default "
            f"T3AR) that the winner rule `{rule}` picks on a labelled holdout of k images per class taken from the "
            f"adaptation part and never adapted on: {how}; it is scored on the held-out evaluation part like every "
            "arm.", "",
            *table(["images per class", "fraction", "wins (source / bn-adapt / default)", "accepted − bn-adapt",
                    "accepted − source", "accepted − hindsight"], rows)]


def winner_rule_lines(res: Mapping[str, Any]) -> list[str]:
    """The winner rule's choice on the validation shifts (:mod:`t3ar_bench.method.winner_rule`): each rule's worst
    validation shift at each holdout size, and the rule chosen."""
    wr = (res.get("selection") or {}).get("winner_rule")
    if not wr:
        return []
    rows = [[t["rule"], t["per_class"], t["cells"], "–" if math.isnan(t["worst"]) else f"{100 * t['worst']:.1f}",
             ", ".join(f"{s} {100 * v:.1f}" for s, v in t["per_shift"].items()),
             ", ".join(f"{m} {n}" for m, n in sorted(t["wins"].items()))] for t in wr["table"]]
    return [f"**Winner rule, chosen on the validation shifts ({', '.join(wr['shifts'])}) by the worst shift at "
            f"{wr['per_class']} image(s) per class: `{wr['chosen']}`** (a tie would keep `{wr['default']}`; "
            "the product's default follows this choice). Evaluation top-1 of each rule's winners, mean over the "
            "selection seeds:", "",
            *table(["rule", "images per class", "cells", "worst shift", "per shift", "wins"], rows), ""]


def label_free_section(res: Mapping[str, Any]) -> list[str]:
    """Per criterion, leave-one-shift-out: cells where bn-adapt and the default differ by more than a point, how
    often the criterion picked the better one, and its share as the literature uses it (threshold 0)."""
    per, v = res.get("label_free_selection"), res.get("label_free_verdict") or {}
    if not per:
        return []
    rows = [[CRITERION_NAMES.get(c, c), d["cells"], d["right"], _share(d["share"]), _share(d["share_at_zero"])]
            for c, d in per.items()]
    out = ["Where bn-adapt and the default T3AR differ by more than a point (a cell: shift, seed, fraction), each "
           "criterion scores both adapted models on their unlabelled target and picks the default when its score "
           "exceeds bn-adapt's by more than a threshold fitted on the other shifts (leave-one-shift-out):", "",
           *table(["criterion", "cells", "right", "share", "share at threshold 0"], rows)]
    if v.get("best") is None:
        out += ["", "No cell: bn-adapt and the default never differ by more than a point."]
    elif v["meets"]:
        out += ["", f"**{CRITERION_NAMES.get(v['best'], v['best'])} is right in {100 * v['share']:.0f} % of the "
                f"cells (≥ {100 * v['required_share']:.0f} %)**: it may guard a job without a holdout."]
    else:
        out += ["", f"**No criterion is right in {100 * v['required_share']:.0f} % of the cells** (the best, "
                f"{CRITERION_NAMES.get(v['best'], v['best'])}, in {100 * v['share']:.0f} %): without a holdout, the "
                "default is what the worst-shift validation prefers."]
    return out


#: the goals the overview plot shows (the acceptance round's), with their thresholds in points
OVERVIEW = (("accepted_vs_bn_adapt", 0.5), ("accepted_vs_source", 3.0), ("accepted_vs_hindsight", -1.0),
            ("no_harm", 0.0), ("labelled_vs_random", 1.5), ("labelled_vs_bn_adapt", 3.0))


def overview_plot(res: Mapping[str, Any], path: Path) -> bool:
    """``path`` (a PNG): each goal of :data:`OVERVIEW` per test fraction, its mean with the 95 % CI over shifts x
    seeds, each shift's mean as a dot and the goal's threshold as a tick; False (nothing written) without goals or
    matplotlib."""
    from t3ar_bench.method.report import pyplot, save_fig

    g = res.get("goals") or {}
    names = dict(GOAL_ROWS)
    rows = [(f"{names[key]} ({100 * float(f):g} %)", d, goal) for key, goal in OVERVIEW
            for f, d in (g.get(key) or {}).get("test", {}).items()]
    plt = pyplot()
    if plt is None or not rows:
        return False
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.4))
    for i, (_, d, goal) in enumerate(rows):
        if d["lo"] is not None and not math.isnan(d["lo"]):
            ax.plot([d["lo"], d["hi"]], [i, i], color="tab:blue", linewidth=2)
        ax.plot([d["mean"]], [i], "o", color="tab:blue")
        ax.plot(list(d.get("per_shift", {}).values()), [i + 0.2] * len(d.get("per_shift", {})), ".", color="grey",
                markersize=4)
        ax.plot([goal], [i], "|", color="tab:red", markersize=14)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("points: mean and 95 % CI over shifts x seeds (blue), each shift's mean (grey), the goal (red)")
    save_fig(plt, fig, path)
    return True

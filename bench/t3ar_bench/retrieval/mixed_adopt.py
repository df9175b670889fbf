"""Issue 52's figures into the adaptation benchmark's report (``adaptation-cpu.{md,json,png}``).

The JSON keeps every key of the last round. Under ``goals`` it gains the issue's keys from the mixed-pool grid
(:mod:`t3ar_bench.retrieval.mixed_report`): ``mixed_retrieval_vs_uniform``, ``mixed_labelled_vs_uniform``,
``labelled_vs_random``, ``labelled_vs_bn_adapt``, ``accepted_vs_bn_adapt_labelled`` (each ``{mode: {fraction:
{mean, lo, hi, n, per_shift}}}`` in points) and the grid's other comparisons as ``mixed_<name>``; and
``neighbour_precision`` (``{retriever: {fraction: {per_shift: {shift: {precision_at_5, pseudo_label_accuracy}}}}}``)
from ``t3ar bench neighbours``. ``labelled_vs_random`` and ``labelled_vs_bn_adapt`` had the last round's values
(the all-relevant labelled pool): those move to ``<key>_labelled_pool``, and ``goals.provenance`` says which run
each goal comes from. The markdown gains one section between markers (replaced on a re-run); the PNG shows the
issue's goals, and the plan's own plot moves to ``adaptation-cpu-acceptance.png``. A rerun of ``t3ar bench adapt
--plan cpu`` rewrites the three files without these: ``t3ar bench mixed --cached-only --adopt`` adds them again.
Pure functions but the writer.
"""

from __future__ import annotations

import copy
import json
import math
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from t3ar_bench.method.report import pyplot, save_fig

#: the issue's goal keys, from the mixed-pool grid, under their own names
ISSUE_GOALS = ("mixed_retrieval_vs_uniform", "mixed_labelled_vs_uniform", "labelled_vs_random",
               "labelled_vs_bn_adapt", "accepted_vs_bn_adapt_labelled")
#: the last round's keys the mixed-pool grid replaces (kept as ``<key>_labelled_pool``)
REPLACED = ("labelled_vs_random", "labelled_vs_bn_adapt")
START, END = "<!-- issue-52:start -->", "<!-- issue-52:end -->"


def neighbour_precision(neighbours: Mapping[str, Any]) -> dict[str, Any]:
    """The issue's shape of ``t3ar bench neighbours``' table: precision@5 and the pseudo-labels' accuracy per
    retriever, fraction and shift (means over its seeds)."""
    out: dict[str, Any] = {}
    for retriever, by_fraction in neighbours["neighbour_precision"].items():
        out[retriever] = {f: {"per_shift": {s: {"precision_at_5": c["precision_at_5"],
                                                "pseudo_label_accuracy": c["pseudo_label_accuracy"]}
                                            for s, c in cell["per_shift"].items()}}
                          for f, cell in by_fraction.items()}
    return out


def adopt(cpu: Mapping[str, Any], mixed: Mapping[str, Any], neighbours: Mapping[str, Any] | None, *,
          source: str) -> dict[str, Any]:
    """``cpu`` (the last round's JSON) with issue 52's figures added; ``source`` names the mixed-pool run."""
    out = copy.deepcopy(dict(cpu))
    goals = out.setdefault("goals", {})
    provenance = dict(goals.get("provenance", {}))
    for key in REPLACED:
        if key in goals and f"{key}_labelled_pool" not in goals:
            goals[f"{key}_labelled_pool"] = goals[key]
            provenance[f"{key}_labelled_pool"] = "the acceptance round's run (the all-relevant labelled pool)"
    for key, value in mixed["goals"].items():
        name = key if key in ISSUE_GOALS or key.startswith("mixed_") else f"mixed_{key}"
        goals[name] = value
        provenance[name] = source
    for key in ISSUE_GOALS:  # a goal the grid could not compute is there, empty, rather than missing
        goals.setdefault(key, {"test": {}})
        provenance.setdefault(key, source)
    if neighbours is not None:
        goals["neighbour_precision"] = neighbour_precision(neighbours)
        provenance["neighbour_precision"] = "t3ar bench neighbours (docs/benchmarks/neighbours.json)"
    goals["provenance"] = provenance
    out["mixed_pool"] = {k: mixed[k] for k in ("validation_shift", "evaluation_shifts", "seeds", "fractions",
                                               "choice", "pools", "plan", "top1", "labelled_items",
                                               "accepted_wins", "bars") if k in mixed}
    out["mixed_pool"]["source"] = source
    return out


def _cell(c: Mapping[str, Any] | None) -> str:
    if not c:
        return "–"
    lo, hi = c.get("lo", math.nan), c.get("hi", math.nan)
    ci = "" if math.isnan(lo) else f" [{lo:+.1f}, {hi:+.1f}]"
    return f"{c['mean']:+.1f}{ci} (n = {c['n']}; {c.get('verdict', '')})"


def section(adopted: Mapping[str, Any], mixed_md_link: str = "mixed-pool.md") -> str:
    """The markdown section of issue 52's figures (between the markers)."""
    goals, mp = adopted["goals"], adopted["mixed_pool"]
    lines = [START, "## Issue 52: retrieval on a pool that looks like a team's", "",
             f"From {mp['source']}; the whole report: [{mixed_md_link}]({mixed_md_link}). Validation shift "
             f"**{mp['validation_shift']}** chose the labelled arm **{mp['choice']['labelled']}** (ranking "
             f"`{mp['choice']['ranking']}`); evaluation shifts {', '.join(mp['evaluation_shifts'])}, seeds "
             f"{', '.join(map(str, mp['seeds']))}. Points, paired over evaluation shift x seed, 95 % CI.", "",
             "| goal | bar | 10 % | 30 % |", "|---|---|---|---|"]
    bars = mp.get("bars", {})
    for key in [*ISSUE_GOALS, *sorted(k for k in goals if k.startswith("mixed_") and k not in ISSUE_GOALS)]:
        g = goals.get(key, {}).get("test", {})
        bar = bars.get(key) if key in bars else bars.get(key.removeprefix("mixed_"))
        lines.append(f"| {key} | {'–' if bar is None else f'{bar:+.1f}'} | {_cell(g.get('0.1'))} | "
                     f"{_cell(g.get('0.3'))} |")
    if "neighbour_precision" in goals:
        np_ = goals["neighbour_precision"]
        ev = set(mp["evaluation_shifts"])
        lines += ["", "Neighbour precision@5 on the labelled pool beside the pseudo-labels' accuracy (%, median over "
                  "the evaluation shifts; goal: precision >= accuracy + 5; per shift, the validation shift too):", "",
                  "| retriever | fraction | precision@5 | pseudo-labels | median of the differences (points) | per "
                  "shift (precision / pseudo-labels) |", "|---|---|---|---|---|---|"]
        for r, by_f in np_.items():
            for f, cell in by_f.items():
                ps = cell["per_shift"]
                prec = sorted(v["precision_at_5"] for s, v in ps.items() if s in ev)
                acc = sorted(v["pseudo_label_accuracy"] for s, v in ps.items() if s in ev)
                per = ", ".join(f"{s} {100 * v['precision_at_5']:.1f} / {100 * v['pseudo_label_accuracy']:.1f}"
                                for s, v in ps.items())
                diff = sorted(v["precision_at_5"] - v["pseudo_label_accuracy"] for s, v in ps.items() if s in ev)
                lines.append(f"| {r} | {f} | {100 * _median(prec):.1f} | {100 * _median(acc):.1f} | "
                             f"{100 * _median(diff):+.1f} | {per} |")
    lines += ["", "The last round's `labelled_vs_random` / `labelled_vs_bn_adapt` (the all-relevant labelled pool) "
              "are kept as `*_labelled_pool`; `goals.provenance` names each goal's run.", END]
    return "\n".join(lines) + "\n"


def _median(xs: list[float]) -> float:
    n = len(xs)
    return math.nan if not n else (xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2)


def with_section(markdown: str, text: str) -> str:
    """``markdown`` with the issue's section replaced (or appended once)."""
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END) + "\n?", re.S)
    return pattern.sub(lambda _: text, markdown) if pattern.search(markdown) else markdown.rstrip("\n") + "\n\n" + text


def plot(adopted: Mapping[str, Any], path: Path) -> bool:
    """The issue's goals (points, 95 % CI) per fraction, with their bars; False without matplotlib."""
    plt = pyplot()
    if plt is None:
        return False
    goals, bars = adopted["goals"], adopted["mixed_pool"].get("bars", {})
    keys = [k for k in ISSUE_GOALS if goals.get(k, {}).get("test")]
    fig, ax = plt.subplots(figsize=(8, 0.7 * max(3, 2 * len(keys)) + 1))
    y = 0.0
    ticks: list[float] = []
    names: list[str] = []
    labelled: set[str] = set()
    for key in keys:
        for f, colour in (("0.1", "tab:blue"), ("0.3", "tab:orange")):
            c = goals[key]["test"].get(f)
            if c:
                err = [[c["mean"] - c["lo"]], [c["hi"] - c["mean"]]] if not math.isnan(c["lo"]) else None
                ax.errorbar([c["mean"]], [y], xerr=err, fmt="o", color=colour,
                            label=f"{float(f):.0%} of the target" if f not in labelled else None)
                labelled.add(f)
                ticks.append(y)
                names.append(f"{key} ({float(f):.0%})")
                if key in bars:
                    ax.plot([bars[key]], [y], marker="|", color="black", markersize=14)
            y += 1
        y += 0.5
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_yticks(ticks, names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("paired difference, points (95 % CI); | = the issue's bar")
    ax.set_title("Issue 52 on the mixed pool (evaluation shifts x seeds)")
    ax.legend(loc="lower right", fontsize=8)
    save_fig(plt, fig, path)
    return True


def write(out_dir: Path, mixed: Mapping[str, Any], neighbours: Mapping[str, Any] | None, *, source: str) -> Path:
    """Adopt into ``out_dir``/adaptation-cpu.{json,md,png}; the JSON is replaced whole or not at all."""
    cpu_path = out_dir / "adaptation-cpu.json"
    cpu = json.loads(cpu_path.read_text())
    adopted = adopt(cpu, mixed, neighbours, source=source)
    tmp = cpu_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(adopted, indent=1, default=str))
    tmp.replace(cpu_path)
    md = out_dir / "adaptation-cpu.md"
    md.write_text(with_section(md.read_text(), section(adopted)))
    png, kept = out_dir / "adaptation-cpu.png", out_dir / "adaptation-cpu-acceptance.png"
    if png.is_file() and "mixed_pool" not in cpu:  # the plan's own plot (a fresh `bench adapt` run): keep it
        shutil.copy2(png, kept)
    plot(adopted, png)
    return cpu_path

"""The mixed-pool grid's report (issue 52, item 3): the choice validation makes, the goals in points, each arm's
top-1 per shift and what the labelled arms trained on. Pure functions of :func:`t3ar_bench.retrieval.mixed_grid.
run_mixed_grid`'s results (no I/O)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from t3ar_bench.retrieval.mixed_goals import (
    RANKING_ARMS,
    accepted_wins,
    choose_labelled,
    mixed_cells,
    mixed_goals,
    validation_means,
)

#: goal -> the issue's bar (points), where it sets one
BARS: dict[str, float] = {"mixed_retrieval_vs_uniform": 3.0, "mixed_labelled_vs_uniform": 3.0,
                          "labelled_vs_random": 1.5, "labelled_vs_bn_adapt": 3.0,
                          "accepted_vs_bn_adapt_labelled": 1.5, "accepted_vs_hindsight_labelled": -1.0}


def arm_table(records: Sequence[Mapping[str, Any]], arms: Sequence[str], shifts: Sequence[str],
              fraction: float) -> dict[str, dict[str, float]]:
    """arm -> shift -> mean top-1 (%) over the seeds of ``fraction``."""
    out: dict[str, dict[str, float]] = {}
    for arm in arms:
        cells = mixed_cells(records, arm)
        row = {s: 100 * statistics.mean(v for k, v in cells.items() if k[0] == s and math.isclose(k[2], fraction))
               for s in shifts if any(k[0] == s and math.isclose(k[2], fraction) for k in cells)}
        if row:
            out[arm] = row
    return out


def labelled_items(records: Sequence[Mapping[str, Any]], arms: Sequence[str]) -> dict[str, dict[str, float]]:
    """Per arm: the mean labelled items it trained on per step, the distinct ones, and the share of uses whose
    label is the query's true class (from the runs' ``label_use``)."""
    out = {}
    for arm in arms:
        uses = [r["label_use"] for r in records if r.get("label") == arm and r.get("label_use")]
        if uses:
            share = [u["query_class_share"] for u in uses if not math.isnan(float(u["query_class_share"]))]
            out[arm] = {"per_step": statistics.mean(float(u["per_step"]) for u in uses),
                        "distinct": statistics.mean(float(u["distinct"]) for u in uses),
                        "query_class_share": statistics.mean(share) if share else math.nan, "runs": len(uses)}
    return out


def verdict(goal: Mapping[str, Any], bar: float | None) -> str:
    """'met' (mean >= bar and, for a positive bar, the CI above 0), 'not met', or 'noise' (the CI spans 0)."""
    mean, lo, hi = goal["mean"], goal["lo"], goal["hi"]
    if bar is None:
        return "noise" if lo <= 0 <= hi else ("above 0" if lo > 0 else "below 0")
    ok = mean >= bar and (bar <= 0 or lo > 0)
    return "met" if ok else ("not met (within noise of 0)" if lo <= 0 <= hi else "not met")


def report(results: Mapping[str, Any], *, validation: str) -> dict[str, Any]:
    """The grid's results plus the validation choice and the goals over the evaluation shifts (all but
    ``validation``)."""
    records = results["records"]
    shifts, seeds, fractions = results["shifts"], results["seeds"], results["fractions"]
    evaluation = [s for s in shifts if s != validation]
    chosen = choose_labelled(records, validation)
    goals = mixed_goals(records, evaluation, seeds, fractions, chosen)
    for name, g in goals.items():
        for cell in g["test"].values():
            cell["verdict"] = verdict(cell, BARS.get(name))
    arms = results["arms"]
    return {**results, "validation_shift": validation, "evaluation_shifts": evaluation,
            "choice": {"labelled": chosen,
                       "validation_seeds": sorted({int(r["seed"]) for r in records if r.get("shift") == validation}),
                       "ranking": next(k for k, v in RANKING_ARMS.items() if v == chosen),
                       "validation_means": validation_means(records, validation, [*RANKING_ARMS.values(),
                                                                                  "t3ar-labels-balanced",
                                                                                  "t3ar-labels-second-stage"]),
                       "rule": "the ranking arm with the best mean top-1 over seeds and fractions on the "
                               "validation shift; the index's ranking on a tie"},
            "goals": goals,
            "accepted_wins": accepted_wins([r for r in records if r.get("shift") in evaluation], chosen),
            "top1": {str(f): arm_table(records, arms, shifts, f) for f in fractions},
            "labelled_items": labelled_items(records, arms), "bars": BARS}


def _pts(x: float) -> str:
    return "–" if x is None or math.isnan(x) else f"{x:+.1f}"


def markdown(rep: Mapping[str, Any]) -> str:
    lines = ["# The mixed pool: retrieval on a pool that looks like a team's (issue 52)", ""]
    for shift, p in rep["pools"].items():
        lines.append(f"- **{shift}**: {p['total']:,} images, {p['relevant']:,} relevant "
                     f"({100 * p['relevant_share']:.1f} %, all labelled), {p['unrelated']:,} unrelated (icon sets, "
                     "clipart, Tux Paint stamps)")
    plan = rep["plan"]
    lines += ["", f"Validation shift **{rep['validation_shift']}**; evaluation shifts "
              f"{', '.join(rep['evaluation_shifts'])}; seeds {', '.join(map(str, rep['seeds']))}; fractions "
              f"{', '.join(str(f) for f in rep['fractions'])}; at most {plan['max_steps']} steps, k = {plan['k']}, "
              f"{plan['image_size']} px, R = {plan['retriever']} at {plan['retriever_size']} px.", "",
              "## Validation's choice", "",
              f"Labelled retrieval arm: **{rep['choice']['labelled']}** (ranking `{rep['choice']['ranking']}`): "
              f"{rep['choice']['rule']} (seeds {', '.join(map(str, rep['choice']['validation_seeds']))}).", "",
              "| arm | validation mean top-1 (%) |", "|---|---|"]
    for arm, v in rep["choice"]["validation_means"].items():
        lines.append(f"| {arm} | {100 * v:.1f} |")
    lines += ["", "## Goals (points, paired over evaluation shifts x seeds, 95 % CI)", "",
              "| goal | bar | fraction | mean [CI] | n | verdict | per shift |", "|---|---|---|---|---|---|---|"]
    for name, g in rep["goals"].items():
        bar = rep["bars"].get(name)
        for f, c in g["test"].items():
            per = ", ".join(f"{s} {_pts(v)}" for s, v in c["per_shift"].items())
            lines.append(f"| {name} | {'–' if bar is None else f'{bar:+.1f}'} | {f} | {_pts(c['mean'])} "
                         f"[{_pts(c['lo'])}, {_pts(c['hi'])}] | {c['n']} | {c['verdict']} | {per} |")
    lines += ["", "Accepted model (1 holdout image per class, the product's rule) over the evaluation cells: "
              + ", ".join(f"{m} {n}" for m, n in sorted(rep["accepted_wins"].items(), key=lambda x: -x[1])) + ".", ""]
    for f, table in rep["top1"].items():
        shifts = list(rep["shifts"])
        lines += [f"## Top-1 (%) at fraction {f}, mean over seeds", "",
                  "| arm | " + " | ".join(shifts) + " |", "|---|" + "---|" * len(shifts)]
        for arm, row in table.items():
            lines.append(f"| {arm} | " + " | ".join(f"{row[s]:.1f}" if s in row else "–" for s in shifts) + " |")
        lines.append("")
    lines += ["## Labelled items the arms trained on", "",
              "The share: of the uses, those whose label is the true class of an image that retrieved the item (for "
              "the draws without retrieval, `t3ar-labels-random` and `t3ar-labels-all`: the class of any adapted "
              "image).", "",
              "| arm | per step | distinct | share of uses of a retrieving image's true class | runs |",
              "|---|---|---|---|---|"]
    for arm, u in rep["labelled_items"].items():
        share = "–" if math.isnan(u["query_class_share"]) else f"{100 * u['query_class_share']:.1f} %"
        lines.append(f"| {arm} | {u['per_step']:.1f} | {u['distinct']:.0f} | {share} | {u['runs']} |")
    s = rep["seconds"]
    lines += ["", f"Runs: {s['run_seconds_total']:.0f} s of adaptation in this gather ({len(rep['records'])} records); "
              f"pool set-up {s['pools']:.0f} s ({s['embedded_images']} images embedded now).", ""]
    return "\n".join(lines)

"""The continual benchmark's summary (accuracy per arm and step, paired differences to the static pool with 95 %
CIs over seeds, pool size, share of past-target neighbours), written as markdown + JSON + a plot."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from t3ar_bench.continual.plan import ARMS
from t3ar_bench.method.plans import paired


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def _nanmean(xs: Sequence[float | None]) -> float:
    return _mean([x for x in xs if x is not None and not math.isnan(x)])


ARM_MEANING = {"static": "the clipart pool",
               "growing": "plus every earlier target, contributed by `t3ar.local_contribute`: exact and R's "
                          "near-duplicates skipped",
               "curated": "growing, then a compaction of the contributed targets after each step",
               "none": "no retrieval"}
R_FIELDS = ("r_past_share", "r_past_same_class", "r_past_same_emoji")  # the diagnostic of R alone (run.py)


def summarise(records: Sequence[Mapping[str, Any]], seeds: Sequence[int], n_steps: int) -> dict[str, Any]:
    arms = [a for a in ARMS if any(r["arm"] == a for r in records)]

    def top1(arm: str, step: int) -> list[float]:
        by_seed = {r["seed"]: r["top1"] for r in records if r["arm"] == arm and r["step"] == step}
        return [by_seed[s] for s in seeds]

    def over_steps(arm: str, steps: range) -> list[float]:  # per seed: the mean over those steps
        return [_mean([next(r["top1"] for r in records if r["arm"] == arm and r["seed"] == s and r["step"] == t)
                       for t in steps]) for s in seeds]

    table = {a: [{"step": t, "top1": _mean(top1(a, t)),
                  "pool_size": _mean([r["pool_size"] for r in records if r["arm"] == a and r["step"] == t]),
                  "past_target_share": _mean([r["past_target_share"] for r in records
                                              if r["arm"] == a and r["step"] == t]),
                  **{f: _nanmean([r.get(f) for r in records if r["arm"] == a and r["step"] == t]) for f in R_FIELDS}}
                 for t in range(n_steps)]
             for a in arms}
    before = [{"step": t, "top1": _mean([r["top1_before"] for r in records if r["step"] == t
                                          and r.get("top1_before") is not None])} for t in range(n_steps)]
    flows = {a: [{"step": t,
                  "added": _mean([r["contributed"]["added"] for r in records
                                  if r["arm"] == a and r["step"] == t and "contributed" in r]),
                  "skipped": _mean([r["contributed"]["skipped_exact"] + r["contributed"]["skipped_near"]
                                    for r in records if r["arm"] == a and r["step"] == t and "contributed" in r]),
                  "removed": _mean([r.get("curated_removed", 0) for r in records
                                    if r["arm"] == a and r["step"] == t and "contributed" in r])}
                 for t in range(n_steps)] for a in arms if a in ("growing", "curated")}
    diffs: dict[str, Any] = {}
    later = range(1, n_steps)  # step 0 has no earlier target: every pool arm is the static pool there
    for a in arms:
        if a == "static" or "static" not in arms:
            continue
        diffs[a] = {"per_step": [paired(top1(a, t), top1("static", t)) for t in range(n_steps)],
                    "later_steps": paired(over_steps(a, later), over_steps("static", later)) if n_steps > 1 else None}
    return {"arms": arms, "table": table, "diffs": diffs, "before": before, "flows": flows}


def _pct(x: float | None) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}"


def _ci(d: Mapping[str, Any] | None) -> str:
    if not d:
        return "–"
    if math.isnan(d.get("lo", math.nan)):
        return f"{100 * d['mean']:+.1f} (n={d['n']}, no CI)"
    return f"{100 * d['mean']:+.1f} [{100 * d['lo']:+.1f}, {100 * d['hi']:+.1f}]"


def verdict(summary: Mapping[str, Any]) -> str:
    g = summary["diffs"].get("growing", {}).get("later_steps")
    if not g or g["n"] < 2:
        return "Too few seeds or steps to say whether a growing pool helps."
    if g["lo"] > 0:
        word = "helps"
    elif g["hi"] < 0:
        word = "hurts"
    else:
        word = "makes no difference we can tell from noise"
    return (f"A growing pool {word}: {_ci(g)} top-1 points against the static pool, averaged over the steps that "
            f"have earlier targets (paired over {g['n']} seeds, 95 % CI).")


def render(res: Mapping[str, Any]) -> str:
    s, plan = res["summary"], res["plan"]
    lines = [f"# Continual adaptation: {plan['name']} plan", "",
             f"Stream {' → '.join(res['stream'])}, seeds {list(plan['seeds'])}, every step from the base model; "
             f"frozen configuration from `{res['frozen_from'] or 'AdaptConfig defaults (no selection given)'}`; "
             f"device {res['device']}, {res['minutes']:.1f} min."
             + (f" Added to every T3AR run: `{dict(plan['options'])}`." if plan.get("options") else ""), "",
             *([f"> {plan['note']}", ""] if plan.get("note") else []), f"**{verdict(s)}**", "",
             "| arm | " + " | ".join(f"step {t}: {st}" for t, st in enumerate(res["stream"])) + " |",
             "|---|" + "---|" * len(res["stream"])]
    if s.get("before"):
        lines.append("| base model (no adaptation) top-1 % | "
                     + " | ".join(_pct(c["top1"]) for c in s["before"]) + " |")
    for a in s["arms"]:
        lines.append(f"| {a} top-1 % | " + " | ".join(_pct(c["top1"]) for c in s["table"][a]) + " |")
    for a, d in s["diffs"].items():
        lines.append(f"| {a} − static | " + " | ".join(_ci(x) for x in d["per_step"]) + " |")
    for a in s["arms"]:
        if a == "none":
            continue
        lines.append(f"| {a}: pool size / past-target neighbours | "
                     + " | ".join(f"{c['pool_size']:.0f} / {_pct(c['past_target_share'])} %" for c in s["table"][a])
                     + " |")
    for a in s["arms"]:
        if a in ("none", "static") or "r_past_share" not in s["table"][a][0]:
            continue
        lines.append(f"| {a}: R's top-{plan['k']} from past targets / of them same class / same emoji % | "
                     + " | ".join(f"{_pct(c['r_past_share'])} / {_pct(c['r_past_same_class'])} / "
                                  f"{_pct(c['r_past_same_emoji'])}" for c in s["table"][a]) + " |")
    for a, steps in s.get("flows", {}).items():
        what = "added / skipped" + (" / curated away" if a == "curated" else "")
        lines.append(f"| {a}: contributed after the step ({what}) | "
                     + " | ".join(f"{c['added']:.0f} / {c['skipped']:.0f}"
                                  + (f" / {c['removed']:.0f}" if a == "curated" else "") for c in steps) + " |")
    later = {a: d["later_steps"] for a, d in s["diffs"].items() if d.get("later_steps")}
    if later:
        lines += ["", "Mean over the steps that have earlier targets (steps 1 onwards), paired over seeds, 95 % CI: "
                  + "; ".join(f"{a} − static {_ci(d)}" for a, d in later.items()) + "."]
    said = ", ".join(f"`{a}` ({ARM_MEANING[a]})" for a in s["arms"] if a in ARM_MEANING)
    lines += ["", f"Arms: {said}. Differences are paired per seed (the same source model, subsets and random "
              "streams in every arm).", ""]
    return "\n".join(lines)


def write(res: Mapping[str, Any], out_dir: Path, stem: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps(res, indent=2, default=float) + "\n")
    (out_dir / f"{stem}.md").write_text(render(res))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = res["summary"]
    steps = range(len(res["stream"]))
    fig, (ax1, ax3, ax2) = plt.subplots(1, 3, figsize=(14, 3.8))
    for j, a in enumerate(s["arms"]):
        ax1.plot(steps, [100 * c["top1"] for c in s["table"][a]], marker="o", label=a)
        if a != "none":
            ax2.plot(steps, [100 * c["past_target_share"] for c in s["table"][a]], marker="o", label=a)
        d = s["diffs"].get(a)
        if d:  # paired difference to the static pool, 95 % CI (no CI: the point alone)
            xs = [t + 0.08 * (j - 1) for t in steps]
            mean = [100 * x["mean"] for x in d["per_step"]]
            lo = [100 * (x["mean"] - x["lo"]) if not math.isnan(x.get("lo", math.nan)) else 0.0 for x in d["per_step"]]
            hi = [100 * (x["hi"] - x["mean"]) if not math.isnan(x.get("hi", math.nan)) else 0.0 for x in d["per_step"]]
            ax3.errorbar(xs, mean, yerr=[lo, hi], marker="o", capsize=3, label=f"{a} − static", color=f"C{j}")
    ax3.axhline(0, color="grey", lw=0.8)
    for ax, title in ((ax1, "top-1 % after each step"), (ax3, "paired difference to static, points (95 % CI)"),
                      (ax2, "neighbours from past targets %")):
        ax.set_xticks(range(len(res["stream"])), res["stream"], rotation=20)
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / f"{stem}.png", dpi=110)
    plt.close(fig)

"""The method benchmark's report (``adaptation-<plan>.md``, ``.json``, PNG plots) for the protocol of
:mod:`t3ar_bench.method.grid`."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from t3ar_bench.method.acceptance_report import (
    acceptance_section,
    label_free_section,
    overview_plot,
    per_shift_section,
)
from t3ar_bench.method.grid import ORACLE, TEST_ARMS, TRAIN_ARMS
from t3ar_bench.method.labelled import ALL_ARM, LABEL_ARMS
from t3ar_bench.method.labelled_report import (
    COLOURS,
    NAMES,
    goals_plot,
    goals_section,
    option_table,
    selection_section,
    use_section,
)
from t3ar_bench.method.quality import DEPTHS
from t3ar_bench.method.report import ci, pct, pyplot, save_fig, write_results

LABELS = {"source": "source only", "bn-adapt": "bn-adapt (target BatchNorm statistics)", "tent": "TENT",
          "shot-im": "SHOT-IM", "adacontrast": "AdaContrast", "sar": "SAR", "eata": "EATA",
          "t3ar-noretrieval": "T3AR without retrieval",
          "t3ar-paper": "T3AR, paper-faithful", "t3ar": "**T3AR, validated**",
          ORACLE: "oracle: validated T3AR, true labels on emoji neighbours (diagnostic)",
          "supervised": "supervised fine-tuning", **NAMES}
STYLE = {"source": ("grey", ":"), "bn-adapt": ("black", "--"), "tent": ("tab:orange", "--"),
         "shot-im": ("tab:green", "--"), "adacontrast": ("tab:cyan", "-"), "t3ar-noretrieval": ("tab:blue", "-"),
         "t3ar-paper": ("tab:purple", "-."), "t3ar": ("tab:red", "-"), ORACLE: ("tab:pink", ":"),
         "supervised": ("tab:brown", "--"), **COLOURS}
TEST_ROWS = (*TEST_ARMS, ORACLE, *LABEL_ARMS)
TRAIN_ROWS = (*TRAIN_ARMS, *(a for a in LABEL_ARMS if a != ALL_ARM))
OPTION_NAMES = {"temperature": "τ", "contrastive_weight": "InfoNCE weight", "diversity_weight": "diversity weight"}


def _label(name: str) -> str:
    return LABELS.get(name, name)


def setting(options: Mapping[str, Any]) -> str:
    """A dict of AdaptConfig options as the report names it ("default" for none)."""
    return ", ".join(f"{OPTION_NAMES.get(k, k)} {v}" for k, v in options.items()) or "default"


def _fraction_label(res: Mapping[str, Any], f: float) -> str:
    shifts = res["plan"]["eval_shifts"]
    n = [max(2, round(f * res["targets"][s]["adapt"])) for s in shifts]
    return f"{100 * f:g} % ({round(sum(n) / len(n))} img)"


def _checks(res: Mapping[str, Any]) -> list[str]:
    v = res["verdict"]
    out = [f"**Goal {'met' if v['met'] else 'NOT met'}.**", ""]
    for c in v["checks"]:
        val = c["value"]
        shown = (f"{100 * val:+.1f} points" + (f", 95 % CI [{100 * c['ci'][0]:+.1f}, {100 * c['ci'][1]:+.1f}]"
                                               if "ci" in c else "")) if isinstance(val, float) else str(val)
        out.append(f"- {c['check']}: {shown} — {'met' if c['met'] else 'NOT met'}")
    return out


def _selection(res: Mapping[str, Any]) -> list[str]:
    p, sel = res["plan"], res["selection"]
    by = sel.get("source_top1_by_shift") or {sel["shift"]: sel["source_top1"]}
    out = [f"Validation shift{'s' if len(by) > 1 else ''} google → {', '.join(by)}, {100 * sel['fraction']:g} % of the "
           f"adaptation part, seeds {sel['seeds']}; source only there: "
           + ", ".join(f"{pct(v)} %" for v in by.values())
           + (" (every top-1 below is the worst of the validation shifts)" if len(by) > 1 else "") + ".", "",
           "| method | mode | " + " | ".join(f"lr {lr:g}" for lr in p["lr_grid"]) + " | chosen |",
           "|---|---|" + "---|" * len(p["lr_grid"]) + "---|"]
    for mode, chosen in (("test", sel["lr"]), ("train", sel["train_lr"])):
        for m, lr in chosen.items():
            row = [r for r in sel["lr_table"] if r["method"] == m and r["mode"] == mode]
            out.append(f"| {_label(m)} | {mode} | " + " | ".join(pct(r["top1"]) for r in row) + f" | {lr:g} |")
    out += ["", "bn-adapt, which BatchNorm layers take the target's statistics (the last N backbone groups' and the "
            "head's; all = every layer): " + ", ".join(
                f"{'all' if r['train_groups'] is None else r['train_groups']}: {pct(r['top1'])} %"
                for r in sel["bn_table"]) + f" → {'all' if sel['bn_groups'] is None else sel['bn_groups']}.", "",
            "The T3AR family's contrastive term (on T3AR without retrieval at its lr; shared by every arm of the "
            "family): " + ", ".join(f"{setting(r['setting'])}: {pct(r['top1'])} %" for r in sel["term_table"])
            + f" → {setting(sel['term'])}.", "",
            f"Retriever R (same-class share of the top {DEPTHS[0]} on validation): **{sel['retriever']}**. "
            "Retrieval options of the validated T3AR, greedily (each kept only if it beats the best so far; the "
            f"paper-faithful T3AR scores {pct(sel['paper_top1'])} % here):", "",
            *option_table(sel["options_table"])]
    out += ["", f"Frozen: the validated T3AR = {setting(sel['validated']['options'])}"
            + (f", R {sel['validated']['retriever']}" if "retriever" in sel["validated"] else ", R as the paper's")
            + f" ({pct(sel['validated_top1'])} % on validation, "
            + ("above" if sel["validated_beats_paper"] else "not above")
            + " the paper-faithful T3AR: " + ("it becomes the product's default `t3ar` configuration)."
                                              if sel["validated_beats_paper"] else "the product keeps the paper's).")]
    return out


def _quality(res: Mapping[str, Any]) -> list[str]:
    q = res["retrieval_quality"]
    out = ["| shift | R | top | same class (of all) | same class (of emoji) | same emoji (of emoji) | emoji share | "
           "queries with a same-class neighbour | chance |", "|---|---|---|---|---|---|---|---|---|"]
    for shift, by_r in q.items():
        for r, by_k in by_r.items():
            for k, d in by_k.items():
                out.append(f"| {shift} | {r} | {k} | {pct(d['same_class_share'])} | {pct(d['same_class_of_emoji'])} | "
                           f"{pct(d['same_emoji_of_emoji'])} | {pct(d['emoji_share'])} | "
                           f"{pct(d['queries_with_same_class'])} | {pct(d['chance_same_class'])} |")
    return out


def _cells(res: Mapping[str, Any], mode: str, arms: Sequence[str], fractions: Sequence[float]) -> list[str]:
    cells = res["cells"][mode]
    out = ["| method | " + " | ".join(_fraction_label(res, f) for f in fractions) + " |",
           "|---|" + "---|" * len(fractions)]
    for m in arms:
        vals = [cells[str(f)].get(m) for f in fractions]
        if all(v is None for v in vals):
            continue
        out.append(f"| {_label(m)} | " + " | ".join(f"{pct(v['mean'])} ± {pct(v['std'])}" if v else "–"
                                                   for v in vals) + " |")
    return out


def _per_shift(res: Mapping[str, Any], mode: str, arms: Sequence[str], fractions: Sequence[float]) -> list[str]:
    shifts = res["plan"]["eval_shifts"]
    out = ["| method | fraction | " + " | ".join(shifts) + " |", "|---|---|" + "---|" * len(shifts)]
    for m in arms:
        for f in fractions:
            c = res["cells"][mode][str(f)].get(m)
            if c:
                out.append(f"| {_label(m)} | {100 * f:g} % | " + " | ".join(pct(c[s]) for s in shifts) + " |")
    return out


def _diffs(res: Mapping[str, Any], mode: str, fractions: Sequence[float]) -> list[str]:
    fs = [str(f) for f in fractions]
    out = ["| comparison | " + " | ".join(f"{100 * f:g} %" for f in fractions) + " |", "|---|" + "---|" * len(fs)]
    for name, key in (("**retrieval alone**: validated T3AR − T3AR without retrieval (its retrieval-off twin)",
                       "retrieval_alone_paired"), ("validated T3AR − paper-faithful T3AR", "vs_paper")):
        cells = [ci(res[key][mode].get(f)) for f in fs]
        if any(c != "–" for c in cells):  # an arm the plan skips (grid_skip, train_skip) has no row
            out.append(f"| {name} | " + " | ".join(cells) + " |")
    if mode == "test" and res.get("oracle_vs_validated"):
        ov = res["oracle_vs_validated"]
        out.append("| oracle − validated T3AR (what right labels on the emoji neighbours would buy) | "
                   + " | ".join(ci(ov[f]) if f in ov else "–" for f in fs) + " |")
    bn = res["vs_bn_adapt_all"][mode]
    arms = list(dict.fromkeys(m for f in fs for m in bn.get(f, {})))
    for m in arms:
        out.append(f"| {_label(m)} − bn-adapt | " + " | ".join(ci(bn[f][m]) if m in bn.get(f, {}) else "–"
                                                            for f in fs) + " |")
    return out


def _pool_data(res: Mapping[str, Any]) -> list[str]:
    out = ["| mode | fraction | neighbours served per step | of them with a known label | known ones rightly "
           "labelled |", "|---|---|---|---|---|"]
    for mode, by_f in res["pool_data"].items():
        for f, d in by_f.items():
            if not math.isnan(d["per_step"]):
                out.append(f"| {mode} | {100 * float(f):g} % | {d['per_step']:.1f} | {d['known_per_step']:.1f} | "
                           f"{pct(d['correct_share'])} % |")
    return out if len(out) > 2 else ["Neighbours as data are not part of the validated configuration: none served."]


def _curves(res: Mapping[str, Any]) -> list[str]:
    out = ["| shift | arm | first / last pseudo-label acc | first / last CE | first / last InfoNCE | last pool "
           "share | last served per step |", "|---|---|---|---|---|---|---|"]
    for r in res["records"]:
        c = r.get("curves")
        if not c:
            continue
        a, z = c[0], c[-1]
        served = z.get("pool_data_count", math.nan)
        out.append(f"| {r['shift']} | {_label(r.get('label', r['method']))} | {pct(a['pl_accuracy'])} / "
                   f"{pct(z['pl_accuracy'])} | {a['loss_ce']:.2f} / {z['loss_ce']:.2f} | "
                   f"{a['loss_contrastive']:.2f} / {z['loss_contrastive']:.2f} | {z['pool_neg_share']:.2f} | "
                   + ("–" if served is None or math.isnan(served) else f"{served:.1f}") + " |")
    return out


def render_grid(res: Mapping[str, Any], stem: str) -> str:
    p = res["plan"]
    cached = sum(float(r.get("seconds") or 0.0) for r in res["records"] if r.get("cached"))
    lines = [f"# Method benchmark, plan `{p['name']}`: does retrieval make adaptation better?", "",
             f"Generated by `t3ar bench adapt --plan {p['name']}` on {dt.date.today().isoformat()}, device "
             f"`{res['device']}` ({res['device_name']}): {res['minutes']['total']:.1f} min, "
             f"{res['runs_executed']} runs executed, {res['runs_cached']} from the run cache"
             + (f" (they had taken {cached / 60:.0f} min of run time)" if cached else "")
             + f"; a cold run executes every run ({res['run_seconds_total'] / 60:.0f} min of run time in all, "
             f"spread over {p['workers']} processes).", ""]
    lines += [f"> {n}" for n in p["notes"]]
    goals = goals_section(res)
    lines += ["", "## Goals", "", *goals] if goals else []
    per_shift = per_shift_section(res)
    lines += ["", *per_shift] if per_shift else []
    accepted = acceptance_section(res)
    lines += ["", "## Acceptance on a labelled holdout", "", *accepted] if accepted else []
    free = label_free_section(res)
    lines += ["", "## Label-free selection (bn-adapt or the default, no labels)", "", *free] if free else []
    lines += ["", "## Verdict", "", *_checks(res), "", "## Protocol", "",
              f"- Source f_S: EfficientNet-Lite0 (packaged ImageNet weights) fine-tuned on the Google emoji style, one "
              f"per seed; 96 subcategories at {p['image_size']} px. Per target style a fixed split: "
              f"{100 * p['eval_share']:g} % of each class held out for evaluation, the rest is the adaptation part.",
              f"- Validation shifts google → {', '.join(res.get('validation_shifts') or [p['validation_shift']])}: "
              "every choice is made there (by the worst of them) and frozen (below). "
              f"Evaluation shifts: {', '.join('google → ' + s for s in p['eval_shifts'])}; seeds {list(p['seeds'])}.",
              f"- Schedule: at most {p['max_steps']} optimiser steps per run ({p['epochs']} epochs at most), batch "
              f"{p['batch_size']} (a short last batch folded into the one before), SGD momentum 0.9 (Nesterov), "
              f"weight decay 1e-4, linear warm-up over {100 * p['warmup_frac']:.0f} % of the steps, cosine decay; the "
              f"last {p['train_groups']} backbone groups, the bottleneck and the head train; lr from "
              f"{list(p['lr_grid'])} per method on validation.",
              "- Paired design: every arm of a (shift, seed, fraction) cell has the same source model, subset, "
              "batch order and target views; the goals' differences are paired per (shift, seed) cell with 95 % "
              "confidence intervals (Student t over the shifts x seeds cells); the tables below pair per seed (the "
              "mean over the evaluation shifts, t over seeds).",
              f"- Pool: OpenClipart + Tux Paint + the emoji styles that are neither source nor target; R at "
              f"{p['retriever_size']} px, chosen among {list(p['retrievers'])}; k = {p['k']}.",
              "- Arms: source only; bn-adapt (the target's BatchNorm statistics, no loss); TENT; SHOT-IM; AdaContrast; "
              "T3AR without retrieval; T3AR paper-faithful (k = 5 drawn from the top 25, retrieved images as InfoNCE "
              "negatives only, the default R); T3AR as validated; an oracle diagnostic. The family's schedule and "
              "term are shared, so T3AR without retrieval is the validated T3AR's retrieval-off twin.",
              *(["- Labelled pool: the emoji items of the pool carry their class as a pool label; the unlabelled "
                 "arms see the same pool without labels; the labelled arms, their random-labelled control and "
                 "the whole-pool reference are described in the goals above (and t3ar_bench/method/labelled.py)."]
                if p.get("labelled") else []),
              "", "## Choices made on the validation shift", "", *_selection(res), *selection_section(res),
              "", "## Retrieval quality", "",
              "Top-k pool neighbours of every adaptation image by each R, against the emoji side labels (clipart has "
              "none: it counts as another class in 'of all'). Reported for every shift; only validation chose R.", "",
              *_quality(res),
              "", "## Test-time results (evaluation shifts, held-out images)", "",
              "Top-1 %, mean over the evaluation shifts, ± std over seeds:", "",
              *_cells(res, "test", TEST_ROWS, p["fractions"]), "", "Per shift (mean over seeds):", "",
              *_per_shift(res, "test", TEST_ROWS, p["fractions"]), "",
              "Paired differences (points, mean over seeds [95 % CI]):", "", *_diffs(res, "test", p["fractions"]),
              *(["", "## Train-time results (labelled adaptation part)", "",
                 *_cells(res, "train", TRAIN_ROWS, p["train_fractions"]), "",
                 "Paired differences (points [95 % CI]; bn-adapt needs no labels, its test-time runs are the "
                 "reference):", "", *_diffs(res, "train", p["train_fractions"])] if p["train_fractions"] else []),
              *(["", "## Labelled items used", "", *use_section(res)] if res.get("label_use") else []),
              "", "## Neighbours as data", "",
              "In the validated T3AR's runs: how many distinct neighbours served as training data per step, how many "
              "of those have a known label (other emoji styles; side labels, for this report only) and how many of "
              "those carried the right pseudo-label:", "", *_pool_data(res),
              "", "## Per-epoch diagnostics", "",
              f"Seed {p['seeds'][0]}, {100 * p['select_fraction']:g} % of each evaluation shift (`{stem}-curves.png`); "
              "pseudo-label accuracy uses the adapted images' labels as a diagnostic only.", "", *_curves(res),
              "", f"Every run (arm, steps, seconds, accuracy, curves) is in `{stem}.json`."]
    return "\n".join(lines) + "\n"


def _plots(res: Mapping[str, Any], out_dir: Path, stem: str) -> None:
    plt = pyplot()
    if plt is None:
        return
    p = res["plan"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, mode, arms, fractions in ((axes[0], "test", TEST_ROWS, p["fractions"]),
                                      (axes[1], "train", TRAIN_ROWS, p["train_fractions"])):
        for m in arms:
            got = [res["cells"][mode][str(f)].get(m) for f in fractions]
            if any(g is None for g in got):
                continue
            colour, ls = STYLE.get(m, ("black", "-"))
            ax.errorbar([100 * f for f in fractions], [100 * g["mean"] for g in got],
                        yerr=[100 * g["std"] for g in got], label=_label(m).strip("*"), color=colour, linestyle=ls,
                        marker="o", capsize=3)
        ax.set_xticks([100 * f for f in fractions], [f"{100 * f:g}" for f in fractions])
        ax.set_xlabel("fraction of the adaptation part (%)")
        ax.set_ylabel("top-1 on held-out images (%)")
        ax.set_title(f"{mode}-time, mean over evaluation shifts")
        ax.legend(fontsize=6)
    save_fig(plt, fig, out_dir / f"{stem}-fraction.png")
    curves = [r for r in res["records"] if r.get("curves")]
    if curves:
        keys = ("pl_accuracy", "loss_ce", "loss_contrastive", "pool_neg_share", "pool_data_count")
        fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.3))
        for ax, key in zip(axes, keys, strict=True):
            for r in curves:
                label = r.get("label", r["method"])
                colour, _ = STYLE.get(label, ("black", "-"))
                ax.plot([c["epoch"] for c in r["curves"]], [c.get(key, math.nan) for c in r["curves"]], color=colour,
                        linestyle=["-", "--", ":", "-."][p["eval_shifts"].index(r["shift"]) % 4],
                        label=f"{_label(label).strip('*')} / {r['shift']}")
            ax.set_title(key)
            ax.set_xlabel("epoch")
        axes[0].legend(fontsize=5)
        save_fig(plt, fig, out_dir / f"{stem}-curves.png")


def write_grid_report(res: Mapping[str, Any], out_dir: Path, *, stem: str) -> None:
    write_results(res, render_grid(res, stem), out_dir, stem)
    _plots(res, out_dir, stem)
    goals_plot(res, out_dir, stem)
    overview_plot(res, out_dir / f"{stem}.png")

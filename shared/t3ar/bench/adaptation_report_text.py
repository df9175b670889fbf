"""Text of the adaptation report: the protocol statement and the numbers behind the verdict."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from t3ar.bench.adaptation_protocol import fraction_size, lookup
from t3ar.method.config import AdaptConfig
from t3ar.method.schedule import steps_per_epoch


def pct(x: Any, digits: int = 1) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * float(x):.{digits}f}"


def pts(x: float) -> str:
    return "–" if math.isnan(x) else f"{100 * x:+.1f}"


def cell(row: Mapping[str, Any] | None) -> str:
    if row is None or math.isnan(float(row["mean"])):
        return "–"
    return f"{pct(row['mean'])} ± {pct(row['std'])}" if row["n"] > 1 else pct(row["mean"])


def ablation_records(results: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[tuple[str, str, str]]]:
    """Records of the ablation seeds at the ablation fraction, keyed by cell (``main:<method>`` or the variant),
    with ``same`` = the sampled neighbours' same-subcategory share; and the (group, label, key) table entries."""
    plan = results["plan"]
    f, seeds = plan["ablation_fraction"], set(plan["ablation_seeds"])
    entries = [("retrievals", "0 (T3AR without retrieval)", "main:t3ar-noretrieval"),
               ("retrievals", f"random (k={plan['k']})", "main:t3ar-random")]
    entries += [("retrievals", str(k), f"k={k}") for k in plan["ablation_ks"]]
    entries += [("retrievals", f"{plan['k']} (T3AR)", "main:t3ar"),
                ("pool", "clipart + other emoji styles (main)", "main:t3ar"),
                ("pool", "clipart + Tux Paint only", "pool: clipart only"),
                ("retriever", "ImageNet EfficientNet-Lite0 (main)", "main:t3ar"),
                ("retriever", "random-init EfficientNet-Lite0", "retriever: random-init"),
                ("retriever", "open_clip CLIP", "retriever: CLIP")]
    recs = []
    for r in results["records"]:
        if r["seed"] in seeds and math.isclose(r["fraction"], f):
            key = f"main:{r['method']}" if r["variant"] == "main" else r["variant"]
            nb = r.get("neighbours") or {}
            recs.append({**r, "variant": "ablation", "method": key, "same": nb.get("same_label_fraction", math.nan)})
    return recs, entries


def _mean(rows: Sequence[Mapping[str, Any]], method: str, f: float, variant: str = "main") -> float:
    r = lookup(rows, variant=variant, method=method, fraction=f)
    return float(r["mean"]) if r else math.nan


def _sampled(records: Sequence[Mapping[str, Any]], method: str, fraction: float, key: str) -> float:
    vals = [float(r["neighbours"][key]) for r in records if r["variant"] == "main" and r["method"] == method
            and math.isclose(r["fraction"], fraction) and r.get("neighbours")]
    vals = [v for v in vals if not math.isnan(v)]
    return statistics.mean(vals) if vals else math.nan


def protocol_lines(results: Mapping[str, Any]) -> list[str]:
    plan, data = results["plan"], results["data"]
    d = AdaptConfig()
    tg = next(iter(data["targets"].values()))
    n_a, n_e = tg["adapt"], tg["eval"]
    sizes = [fraction_size(n_a, f) for f in plan["fractions"]]
    steps = [max(plan["epochs"] * steps_per_epoch(n, min(plan["batch_size"], n)), plan["min_steps"]) for n in sizes]
    comps = data["pool_components"]
    shifts = plan["shifts"]
    emoji_in_pool = [s for s in comps if s not in ("openclipart", "tuxpaint")]
    per_shift_pool = comps.get("openclipart", 0) + comps.get("tuxpaint", 0) + sum(
        comps[s] for s in emoji_in_pool if s != shifts[0])
    return [
        "",
        f"- **Data** (built by the data kit from npm/Debian packages): the emoji kit at {plan['image_size']} px, "
        f"{data['classes']} classes = emoji-datasource *subcategories*, the same {data['source_images']} emoji in "
        "every style. **Source** S = Google style (all of it trains f_S). **Targets** T (one shift each): "
        + ", ".join(shifts) + ".",
        f"- **Split** (fixed per target style, seed {plan['split_seed']}, not the run seed): per subcategory, "
        f"{100 * plan['eval_share']:g} % of the images are held out for evaluation ({n_e} images), the rest is the "
        f"adaptation part ({n_a} images). Every method, fraction and seed is evaluated on exactly these held-out "
        "images, which adaptation never sees.",
        f"- **Fractions**: {', '.join(f'{100 * f:g} %' for f in plan['fractions'])} of the adaptation part = "
        f"{', '.join(map(str, sizes))} images: label-blind seeded subsets, nested per seed (prefixes of one "
        "permutation), at least 2 images.",
        f"- **Schedule, identical for every method**: max(epochs × steps per epoch, min_steps) SGD steps with "
        f"epochs = {plan['epochs']} and min_steps = {plan['min_steps']} (so tiny fractions still train): "
        f"{' / '.join(map(str, steps))} steps at {' / '.join(f'{100 * f:g} %' for f in plan['fractions'])}; batch "
        f"{plan['batch_size']} (or the whole subset when smaller); lr {plan['lr']:g}, Nesterov momentum "
        f"{d.momentum}, weight decay {d.weight_decay:g}, {100 * d.warmup_frac:g} % linear warm-up then cosine. "
        f"T3AR family: τ = {d.temperature}, bank {d.bank_size}, dedup r = {d.r}, k = {plan['k']}. "
        "**No hyper-parameter was tuned**: lr and the rest are the AdaptConfig defaults; nothing was chosen by "
        "looking at evaluation images.",
        f"- **Model**: EfficientNet-Lite0 with the packaged ImageNet weights, {plan['image_size']} px input, 256-d "
        f"bottleneck + BN, weight-normalised head. **What trains**: the last {plan['train_groups']} backbone groups "
        "+ bottleneck + head (SHOT-IM freezes the head, TENT trains BatchNorm affine parameters only); the other "
        "BatchNorm layers keep their statistics.",
        f"- **Source model f_S**: cross-entropy with label smoothing 0.1 on weak views, {plan['source_epochs']} "
        f"epoch(s), lr {plan['source_lr']:g}, same trainable layers; one per seed, cached (re-runs skip training).",
        f"- **Pool A** per shift: OpenClipart ({comps.get('openclipart', 0)}) + Tux Paint ({comps.get('tuxpaint', 0)}) "
        f"+ the emoji styles that are neither S nor T ({', '.join(f'{s} {comps[s]}' for s in emoji_in_pool)}; "
        f"e.g. {per_shift_pool} images for {shifts[0]}). A never holds an image of S or T.",
        f"- **Retriever R**: the packaged ImageNet EfficientNet-Lite0 at {plan['retriever_size']} px (pooled, "
        "L2-normalised), exact inner-product search (faiss); neighbours fixed per job, k sampled from the top r·k.",
        "- **Methods**: source only; TENT (entropy, BN affine); SHOT-IM (entropy + diversity); AdaContrast "
        "(Chen et al. 2022: momentum encoder, soft-voting pseudo-labels); T3AR without retrieval; T3AR with k "
        "uniformly random pool images; T3AR. Test-time setting: target labels "
        "are never used except for evaluation and the retrieval diagnostics.",
        f"- **Seeds**: {list(plan['seeds'])} (each seed: its own source model, subsets, augmentations and "
        "sampling); mean ± sample std over seeds.",
        f"- **Budget choices** (full run ≤ 60 min on 2 CPU cores): {plan['image_size']} px (the kit's native size; "
        f"96 px costs 2.25×); {plan['epochs']} epoch with a {plan['min_steps']}-step floor, so every fraction gets "
        "about the same compute; only the last backbone groups train; ablations on "
        f"{len(plan['ablation_seeds'])} seed(s) at {100 * plan['ablation_fraction']:g} %.",
    ]


def why_lines(results: Mapping[str, Any], dmain: Mapping[str, float]) -> list[str]:
    """The numbers that explain the verdict, and what would change it."""
    from t3ar.bench.adaptation_protocol import aggregate

    plan, rows, recs = results["plan"], results["aggregate"], results["records"]
    fr = plan["fractions"]
    out = []
    eff = [(f, _mean(rows, "t3ar", f) - _mean(rows, "t3ar-noretrieval", f)) for f in fr]
    rnd = [(f, _mean(rows, "t3ar", f) - _mean(rows, "t3ar-random", f)) for f in fr]
    out.append("- Effect of retrieval, T3AR − T3AR without retrieval: "
               + ", ".join(f"{pts(e)} at {100 * f:g} %" for f, e in eff)
               + "; nearest vs random neighbours, T3AR − T3AR-random: "
               + ", ".join(f"{pts(e)} at {100 * f:g} %" for f, e in rnd) + " (points).")
    others = ("tent", "shot-im", "adacontrast", "t3ar-noretrieval")
    best = [(f, max(((m, _mean(rows, m, f)) for m in others), key=lambda t: t[1]))
            for f in fr]
    out.append("- Strongest adaptation baseline: " + ", ".join(f"{m} {pct(v)} at {100 * f:g} %" for f, (m, v) in best)
               + f"; source only {pct(_mean(rows, 'source', fr[0]))}.")
    n_a = next(iter(results["data"]["targets"].values()))["adapt"]
    for f in fr:
        src = _mean(rows, "source", f)
        adapted = [m for m in plan["methods"] if m != "source"]
        if all(_mean(rows, m, f) < src for m in adapted):
            out.append(f"- At {100 * f:g} % of T ({fraction_size(n_a, f)} images, {plan['min_steps']} steps) every "
                       f"adaptation method ends *below* the source model ({pct(src)}): on so few images the updates "
                       "drift rather than adapt, so the best 'baseline' there is not adapting at all.")
    low = [f for f in fr if f < 1.0]
    same = [_sampled(recs, "t3ar", f, "same_label_fraction") for f in low]
    item = [_sampled(recs, "t3ar", f, "same_item_fraction") for f in low]
    known = [_sampled(recs, "t3ar", f, "known_fraction") for f in low]
    chance = dmain.get("chance_same_label", math.nan)
    out.append(
        "- T3AR uses retrieved neighbours as **negatives**. Of the neighbours it sampled, "
        f"{'/'.join(pct(k) for k in known)} % "
        f"(at {'/'.join(f'{100 * f:g} %' for f in low)}) come from the other emoji styles; of those, "
        f"{'/'.join(pct(s) for s in same)} % have the query's own subcategory (chance: {pct(chance)} %) and "
        f"{'/'.join(pct(s) for s in item)} % are the very same emoji drawn in another style. In the top r·k "
        f"candidates the same-subcategory share is {pct(dmain.get('same_label_fraction'))} %.")
    arecs, _ = ablation_records(results)
    abl = aggregate(arecs)
    f = plan["ablation_fraction"]
    get = {key: _mean(abl, key, f, "ablation") for key in ("main:t3ar", "pool: clipart only", "retriever: random-init",
                                                           "main:t3ar-noretrieval", "main:t3ar-random")}
    out.append(f"- Ablations at {100 * f:g} %: pool without the other emoji styles "
               f"{pts(get['pool: clipart only'] - get['main:t3ar'])}, random-init retriever "
               f"{pts(get['retriever: random-init'] - get['main:t3ar'])} points relative to T3AR "
               f"({pct(get['main:t3ar'])}).")
    out += _reading(results, same, chance, get, eff, rnd)
    out.append("- What would change it (method changes, not tried here; they would have to be chosen on a "
               "validation shift): (1) stop using same-class neighbours as negatives — drop a retrieved neighbour "
               "whose prediction equals the query's pseudo-label, as target negatives already are; (2) a pool "
               "without near-copies of the target classes, or retrieved images used for pseudo-label refinement "
               "rather than as negatives; (3) a longer schedule (the paper trains 30–100 epochs; here about "
               f"{plan['min_steps']} steps per run) so that the bank and the pseudo-label filter matter.")
    return out


def _reading(results: Mapping[str, Any], same: Sequence[float], chance: float, get: Mapping[str, float],
             eff: Sequence[tuple[float, float]], rnd: Sequence[tuple[float, float]]) -> list[str]:
    """An interpretation that follows from the numbers above (each clause is conditional on them)."""
    rows = results["aggregate"]
    valid = [s for s in same if not math.isnan(s)]
    s_mean = statistics.mean(valid) if valid else math.nan
    noise = statistics.mean(float(r["std"]) for r in rows if r["variant"] == "main" and r["shift"] == "average"
                            and r["method"] in ("t3ar", "t3ar-noretrieval", "t3ar-random") and r["n"] > 1) \
        if any(r["n"] > 1 for r in rows) else math.nan
    parts = []
    if not math.isnan(s_mean) and not math.isnan(chance):
        if s_mean > 2 * chance:
            parts.append(f"The retriever does find related images: {pct(s_mean)} % of the sampled neighbours of known "
                         f"label share the query's subcategory, {s_mean / chance:.1f}× chance. T3AR uses them only "
                         "as negatives, so those are false negatives that push a query away from its own class.")
        else:
            parts.append("The sampled neighbours share the query's subcategory hardly more often than chance, so the "
                         "extra negatives are generic rather than hard.")
    d_pool = get["pool: clipart only"] - get["main:t3ar"]
    if not math.isnan(d_pool):
        verdict = (", which fits the false-negative reading." if d_pool >= 0.01 else
                   ", so false negatives are not what holds it back." if d_pool <= -0.01 else
                   ", i.e. no measurable change (within 1 point).")
        parts.append("Removing the emoji styles (the only same-class material) from the pool changes T3AR by "
                     f"{pts(d_pool)} points{verdict}")
    parts.append(f"Note also how few pool negatives a query gets: only its own k = {results['plan']['k']} retrieved "
                 "images (however many copies the bank holds) count as its negatives, against every bank entry of T "
                 "with another pseudo-label.")
    small = [abs(e) for _, e in eff] + [abs(e) for _, e in rnd]
    if small and not math.isnan(noise) and max(small) <= 2 * noise:
        parts.append(f"All retrieval effects are within about twice the seed-to-seed std ({pct(noise)} points): with "
                     "this short schedule, extra pool negatives — nearest, random or none — barely change the "
                     "result.")
    return [f"- **Reading.** {' '.join(parts)}"] if parts else []

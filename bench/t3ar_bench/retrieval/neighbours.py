"""Neighbour precision per shift for every retriever option, beside the pseudo-labels' accuracy (issue 52, item 1).

Retrieval pays only when it lands in a target image's class more often than the model's own guess does. Per
shift and fraction this measures, over the adapted images (the images a job draws neighbours for), the share of
each image's k nearest labelled pool items that carry its true class (precision@k) and the share of images with
at least one (hit rate), for each way of ranking the pool:

- ``index``: R, the pool's retriever (ImageNet EfficientNet-Lite0 at 96 px);
- ``base``: the base model's features; ``base-bn``: the same after BatchNorm statistics are re-estimated on the
  adapted images;
- ``base-rerank``: R's r*k candidates re-ranked by the ``base-bn`` features (:func:`t3ar.method.ranking.
  rerank_by_features`, the product's option);
- ``class-conditional``: R's nearest among the items labelled with the image's confident ``base-bn`` pseudo-label,
  then R's others (:func:`t3ar.method.ranking.class_conditional_rank`, the product's option);
- ``label-adapted``: R's r*k candidates re-ranked by cosine in the space of a map fit on the labelled pool items'
  R vectors and classes (:func:`t3ar.label_metric.adapted_rerank`, regularised LDA; fit per shift on its pool's
  items only, never on target images or labels); ``label-adapted-all``: every labelled item ranked in that space
  (what an index of the mapped vectors would answer: the reference for the re-ranking's candidate limit);
- ``refined-class-conditional``: class-conditional retrieval (R's nearest among the items of one class) on a
  refined pseudo-label, the arg-max of the model's probabilities and the ``label-adapted`` neighbours' vote shares
  mixed half and half (:func:`t3ar.label_metric.refine_pseudo_labels`), for every image (no confidence threshold:
  its precision is the refined pseudo-labels' accuracy wherever the pool holds k items of the class);
  ``refined-index-class-conditional``: the same with the vote of R's own k nearest (no map: what the label map adds
  to the refined pseudo-label);
- ``random``: uniform random labelled items; ``class-matched-random``: random items of the pseudo-label's class.

and the ``base-bn`` pseudo-labels' accuracy on the same images. Nothing here chooses an option: it measures them.

Per seed, the base model's features (without BatchNorm re-estimation) of each style are computed once and shared
by every shift and fraction; R vectors once per style; the label map once per shift (its pool does not depend on
the seed). Only what depends on the adapted images (BatchNorm re-estimated on them, the pool's features under it)
is computed per shift, fraction and seed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from t3ar.label_metric import (
    DEFAULT_SHRINKAGE,
    LabelMetric,
    adapted_rerank,
    fit_label_metric,
    neighbour_vote,
    refine_pseudo_labels,
)
from t3ar.method.neighbour_quality import hit_rate, label_agreement
from t3ar.method.ranking import class_conditional_rank, confident_pseudo_labels, rerank_by_features

log = logging.getLogger(__name__)

RETRIEVERS: tuple[str, ...] = ("index", "base", "base-bn", "base-rerank", "class-conditional", "label-adapted",
                               "label-adapted-all", "refined-class-conditional", "refined-index-class-conditional",
                               "random", "class-matched-random")
#: the options that need the label map or the queries' logits (the refined pseudo-labels)
ADAPTED: tuple[str, ...] = ("label-adapted", "label-adapted-all", "refined-class-conditional",
                            "refined-index-class-conditional")
#: the options a job could rank by (each ranks only what the pool's index answered: its plain or label-filtered
#: search), among which validation chooses; ``base``/``base-bn`` (every pool image seen by the model) and
#: ``label-adapted-all`` (an index of the mapped vectors) are references, ``random``/``class-matched-random`` controls
CHOOSABLE: tuple[str, ...] = ("index", "base-rerank", "class-conditional", "label-adapted",
                              "refined-class-conditional", "refined-index-class-conditional")
#: the issue's goal: precision@5 at least the pseudo-labels' accuracy + this many points (median over shifts)
GOAL_POINTS = 5.0
#: the weight of the labelled neighbours' vote against the model's probabilities in the refined pseudo-label (a
#: prior: half and half)
REFINE_WEIGHT = 0.5


def _top(scores: torch.Tensor, k: int) -> torch.Tensor:
    return torch.sort(-scores, dim=1, stable=True).indices[:, :k]


def _cos(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    return F.normalize(q.float(), dim=1) @ F.normalize(p.float(), dim=1).T


def rankings(r_q: torch.Tensor, r_p: torch.Tensor, base_q: torch.Tensor, base_p: torch.Tensor, bn_q: torch.Tensor,
             bn_p: torch.Tensor, pool_classes: torch.Tensor, pseudo: torch.Tensor, confident: torch.Tensor, *,
             k: int, r: int, generator: torch.Generator, metric: LabelMetric | None = None,
             logits: torch.Tensor | None = None, refine_weight: float = REFINE_WEIGHT) -> dict[str, torch.Tensor]:
    """Each retriever option's k neighbours per query ([N, k] pool indices, -1 = missing) among the labelled pool
    items (``pool_classes`` >= 0; every vector and feature row aligned with it). The :data:`ADAPTED` options need
    ``metric`` (the label map, fit on the pool's labelled items) and/or ``logits`` (the queries' [N, C], for the
    refined pseudo-labels); without them they are left out."""
    labelled = pool_classes >= 0
    if not bool(labelled.any()):
        raise ValueError("the pool has no labelled item")
    mask = torch.where(labelled, 0.0, -torch.inf)
    r_scores = _cos(r_q, r_p) + mask
    bn_scores = _cos(bn_q, bn_p) + mask
    out = {"index": _top(r_scores, k), "base": _top(_cos(base_q, base_p) + mask, k), "base-bn": _top(bn_scores, k)}
    cand = _top(r_scores, k * r)
    cand = cand.masked_fill(~labelled[cand], -1)
    out["base-rerank"] = rerank_by_features(bn_q, bn_p, cand)[:, :k]
    # unlabelled items score -inf: they come after every labelled one
    out["class-conditional"] = class_conditional_rank(r_scores, pool_classes, pseudo, confident, k)
    if metric is not None:
        adapted = adapted_rerank(metric, r_q, r_p, cand)
        out["label-adapted"] = adapted[:, :k]
        out["label-adapted-all"] = _top(_cos(metric.transform(r_q), metric.transform(r_p)) + mask, k)
        if logits is not None:
            refined, every = refine_pseudo_labels(logits, neighbour_vote(adapted, pool_classes, logits.shape[1], k),
                                                  refine_weight, 0.0)
            out["refined-class-conditional"] = class_conditional_rank(r_scores, pool_classes, refined, every, k)
    if logits is not None:
        refined, every = refine_pseudo_labels(logits, neighbour_vote(cand, pool_classes, logits.shape[1], k),
                                              refine_weight, 0.0)
        out["refined-index-class-conditional"] = class_conditional_rank(r_scores, pool_classes, refined, every, k)
    n = len(r_q)
    lab_idx = torch.nonzero(labelled).flatten()
    out["random"] = lab_idx[torch.rand(n, len(lab_idx), generator=generator).argsort(dim=1)[:, :k]]
    matched = torch.full((n, k), -1, dtype=torch.long)
    for i in range(n):
        of_class = torch.nonzero(pool_classes == pseudo[i]).flatten()
        if len(of_class):
            matched[i] = of_class[torch.randint(len(of_class), (k,), generator=generator)]
    out["class-matched-random"] = matched
    return {name: out[name] for name in RETRIEVERS if name in out}


def precision_table(ranked: Mapping[str, torch.Tensor], pool_classes: torch.Tensor, truth: torch.Tensor,
                    pseudo: torch.Tensor) -> dict[str, dict[str, float | None]]:
    """Per retriever: precision@k (true class among the labelled neighbours), hit rate, and the pseudo-labels'
    accuracy on the same images (one number, repeated beside each)."""
    acc = float((pseudo == truth).float().mean()) if len(truth) else None
    out: dict[str, dict[str, float | None]] = {}
    for name, idx in ranked.items():
        classes = torch.where(idx >= 0, pool_classes[idx.clamp(min=0)], -1)
        out[name] = {"precision_at_5": label_agreement(classes, truth).share, "hit_rate": hit_rate(classes, truth),
                     "pseudo_label_accuracy": acc}
    return out


@dataclass
class ShiftData:
    """One shift's inputs: target images and labels (model class indices), the labelled pool's images and classes
    and its R vectors, the target's R vectors; the base model's features (as it is, no BatchNorm re-estimation) of
    the target and the pool; the label map fit on the pool (None: the :data:`ADAPTED` options are left out)."""

    shift: str
    images: torch.Tensor
    labels: torch.Tensor
    pool_images: torch.Tensor
    pool_classes: torch.Tensor
    r_pool: torch.Tensor
    r_target: torch.Tensor
    base_target: torch.Tensor
    base_pool: torch.Tensor
    metric: LabelMetric | None = None


def measure(model: Any, spec: Any, data: ShiftData, rows: Sequence[int], *, k: int, r: int, seed: int,
            train_groups: int | None, min_confidence: float, device: torch.device) -> dict[str, dict[str, Any]]:
    """The precision table of one shift on the adapted images ``rows`` (BatchNorm re-estimated on them)."""
    from t3ar.retrieval_ranking import BaseView

    x = data.images[list(rows)]
    truth = data.labels[list(rows)]
    view = BaseView(model, x, mean=spec.backbone.mean, std=spec.backbone.std, device=device,
                    train_groups=train_groups, batch_size=32, seed=seed)
    bn_q, logits = view.features_logits(x)
    bn_p = view.features_logits(data.pool_images)[0]
    pseudo, confident = confident_pseudo_labels(logits, min_confidence)
    ranked = rankings(data.r_target[list(rows)], data.r_pool, data.base_target[list(rows)], data.base_pool, bn_q,
                      bn_p, data.pool_classes, pseudo, confident, k=k, r=r,
                      generator=torch.Generator().manual_seed(seed), metric=data.metric, logits=logits)
    table = precision_table(ranked, data.pool_classes, truth, pseudo)
    for row in table.values():
        row["confident_share"] = float(confident.float().mean())
    return table


def base_features(model: Any, spec: Any, images: torch.Tensor, *, train_groups: int | None,
                  device: torch.device) -> torch.Tensor:
    """The base model's features (as it is: no BatchNorm re-estimation, eval mode) of ``images``: the same for
    every shift and fraction of a seed, so computed once per style."""
    from t3ar.retrieval_ranking import BaseView

    view = BaseView(model, images[:1], mean=spec.backbone.mean, std=spec.backbone.std, device=device,
                    train_groups=train_groups, reestimate=False)
    return view.features_logits(images)[0]


def run_neighbours(work: Path, cache: Path, *, shifts: Sequence[str], fractions: Sequence[float],
                   seeds: Sequence[int], k: int = 5, r: int = 5, min_confidence: float = 0.5,
                   source_epochs: int = 6, shrinkage: float = DEFAULT_SHRINKAGE, label_adapted: bool = True,
                   device: torch.device | None = None) -> dict[str, Any]:
    """Measure :data:`RETRIEVERS` on each shift (the emoji kit's styles; the labelled pool: the kit's other styles
    outside the target's and the source's artwork families), fraction and seed (the CPU plan's source model and
    target split). Returns ``{"neighbour_precision": {retriever: {fraction: {per_shift: {shift: {...}}}}}, ...}``:
    the shape the adaptation benchmark's JSON carries, with means over seeds, and ``timings`` (seconds per stage).
    ``label_adapted`` False leaves the :data:`ADAPTED` options out."""
    from t3ar.embedder import Embedder, EmbedderSpec
    from t3ar.models.backbones import PRESETS
    from t3ar_bench.method.data import build_kits, load_style, source_model
    from t3ar_bench.method.labelled_pool import pool_names
    from t3ar_bench.method.plans import CPU
    from t3ar_bench.method.protocol import SOURCE_STYLE, fraction_subset, split_adapt_eval
    from t3ar_bench.method.runs import source_config

    device = device or torch.device("cpu")
    t0 = time.perf_counter()
    kits = build_kits(work, cache)
    plan = CPU
    source = load_style(kits.emoji, SOURCE_STYLE, plan.image_size)
    embedder = Embedder(EmbedderSpec(backbone=PRESETS["efficientnet_lite0"], image_size=plan.retriever_size), device)
    kit_styles = [s for s in kits.emoji_request["styles"] if s != SOURCE_STYLE]
    per: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] = {}
    styles: dict[str, Any] = {}
    r_vecs: dict[str, torch.Tensor] = {}
    timings: dict[str, float] = {"kits": round(time.perf_counter() - t0, 1), "r_vectors": 0.0, "source_models": 0.0,
                                 "base_features": 0.0, "label_map_fits": 0.0, "measure": 0.0}

    def timed(stage: str, since: float) -> None:
        timings[stage] = round(timings[stage] + time.perf_counter() - since, 1)

    def style(name: str) -> Any:
        if name not in styles:
            t = time.perf_counter()
            styles[name] = load_style(kits.emoji, name, plan.image_size, source.classes)
            r_vecs[name] = torch.from_numpy(embedder.embed(styles[name].images))
            timed("r_vectors", t)
        return styles[name]

    pools = {shift: [n for n in pool_names(shift, [], kit_styles, []) if n != SOURCE_STYLE] for shift in shifts}
    metrics: dict[str, LabelMetric] = {}
    for shift in shifts if label_adapted else []:  # fit on the pool's labelled items only (the same every seed)
        labels = torch.cat([style(n).labels for n in pools[shift]])
        t = time.perf_counter()
        metrics[shift] = fit_label_metric(torch.cat([r_vecs[n] for n in pools[shift]]), labels, shrinkage=shrinkage)
        timed("label_map_fits", t)
    for seed in seeds:
        t = time.perf_counter()
        src = source_model(work, source, source_config(plan, seed).model_copy(update={"epochs": source_epochs}),
                           plan.image_size, kits.emoji_request, device)
        timed("source_models", t)
        base: dict[str, torch.Tensor] = {}  # this seed's base features per style, shared by shifts and fractions
        for name in dict.fromkeys([*shifts, *(n for s in shifts for n in pools[s])]):
            images = style(name).images
            t = time.perf_counter()
            base[name] = base_features(src.model, src.spec, images, train_groups=plan.train_groups, device=device)
            timed("base_features", t)
        for shift in shifts:
            target = style(shift)
            names = pools[shift]
            parts = [style(n) for n in names]
            data = ShiftData(shift, target.images, target.labels, torch.cat([p.images for p in parts]),
                             torch.cat([p.labels for p in parts]), torch.cat([r_vecs[n] for n in names]), r_vecs[shift],
                             base[shift], torch.cat([base[n] for n in names]), metrics.get(shift))
            adapt, _ = split_adapt_eval(target.labels.tolist(), plan.eval_share, plan.split_seed)
            for f in fractions:
                t = time.perf_counter()
                rows = [adapt[i] for i in fraction_subset(len(adapt), f, seed)]
                table = measure(src.model, src.spec, data, rows, k=k, r=r, seed=seed, train_groups=plan.train_groups,
                                min_confidence=min_confidence, device=device)
                timed("measure", t)
                for name, row in table.items():
                    per.setdefault(name, {}).setdefault(str(f), {}).setdefault(shift, []).append(row)
                log.info("neighbours %s f=%s seed %d (%.0f s): %s", shift, f, seed, time.perf_counter() - t,
                         {n: round(v["precision_at_5"] or 0, 3) for n, v in table.items()})
    out = {name: {f: {"per_shift": {s: _mean(rows) for s, rows in by_s.items()}} for f, by_s in by_f.items()}
           for name, by_f in per.items()}
    return {"neighbour_precision": out, "pools": pools, "k": k, "r": r, "min_confidence": min_confidence,
            "seeds": list(seeds), "fractions": list(fractions), "source_epochs": source_epochs,
            "label_map": {"method": "regularised LDA on the pool's labelled R vectors", "shrinkage": shrinkage,
                          "refine_weight": REFINE_WEIGHT} if label_adapted else None,
            "timings": timings, "seconds": round(time.perf_counter() - t0, 1)}


def _mean(rows: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    keys = rows[0].keys()
    out: dict[str, float | None] = {}
    for key in keys:
        vals = [float(r[key]) for r in rows if r[key] is not None]
        out[key] = round(float(np.mean(vals)), 4) if vals else None
    out["n"] = len(rows)
    return out


def markdown(results: Mapping[str, Any]) -> str:
    """The precision table as markdown: one row per retriever and shift, a column per fraction."""
    np_ = results["neighbour_precision"]
    fractions = [str(f) for f in results["fractions"]]
    lines = [f"precision@{results['k']} of the labelled neighbours (true class), mean over seeds "
             f"{results['seeds']}; the pseudo-labels' accuracy (base model, BatchNorm of the target) beside it", "",
             "| retriever | shift | " + " | ".join(f"precision@{results['k']} at {f}" for f in fractions)
             + " | " + " | ".join(f"pseudo-label acc. at {f}" for f in fractions) + " |",
             "|---|---|" + "---|" * (2 * len(fractions))]
    shifts = sorted({s for by_f in np_.values() for f in by_f.values() for s in f["per_shift"]})
    for name in np_:
        for s in shifts:
            cells = [np_[name][f]["per_shift"].get(s, {}) for f in fractions]
            lines.append(f"| {name} | {s} | " + " | ".join(_pct(c.get("precision_at_5")) for c in cells) + " | "
                         + " | ".join(_pct(c.get("pseudo_label_accuracy")) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def summary(results: Mapping[str, Any], validation: str) -> dict[str, Any]:
    """The issue's goal and validation's choice, from the results alone. Per retriever and fraction: precision@5 -
    pseudo-label accuracy in points per shift, their median over the evaluation shifts (every shift but
    ``validation``) and over every shift, and whether the evaluation median reaches :data:`GOAL_POINTS`. Per
    fraction: the :data:`CHOOSABLE` option with the highest precision on the validation shift (the worst-shift
    rule with one validation shift; a tie goes to the earlier, simpler option), and that option's figures."""
    np_ = results["neighbour_precision"]
    goal: dict[str, dict[str, Any]] = {}
    for name, by_f in np_.items():
        for f, cell in by_f.items():
            gaps = {s: round(100 * (row["precision_at_5"] - row["pseudo_label_accuracy"]), 2)
                    for s, row in cell["per_shift"].items()
                    if row.get("precision_at_5") is not None and row.get("pseudo_label_accuracy") is not None}
            evaluation = [g for s, g in gaps.items() if s != validation]
            med = round(float(np.median(evaluation)), 2) if evaluation else None
            goal.setdefault(name, {})[f] = {
                "per_shift": gaps, "median_evaluation": med,
                "median_all": round(float(np.median(list(gaps.values()))), 2) if gaps else None,
                "met": None if med is None else bool(med >= GOAL_POINTS)}
    choice: dict[str, Any] = {}
    for f in (str(x) for x in results["fractions"]):
        scored = [(np_[n][f]["per_shift"][validation]["precision_at_5"], -i, n) for i, n in enumerate(CHOOSABLE)
                  if n in np_ and validation in np_[n].get(f, {}).get("per_shift", {})]
        if scored:
            best = max(scored)[2]
            choice[f] = {"retriever": best, "validation_precision_at_5": max(scored)[0], "goal": goal[best][f]}
    return {"validation_shift": validation, "goal_points": GOAL_POINTS, "goal": goal, "validation_choice": choice}


def summary_markdown(summ: Mapping[str, Any]) -> str:
    """The goal table (points over the pseudo-labels' accuracy) and validation's choice as markdown."""
    goal = summ["goal"]
    fractions = list(next(iter(goal.values()))) if goal else []
    shifts = sorted({s for by_f in goal.values() for c in by_f.values() for s in c["per_shift"]})
    val = summ["validation_shift"]
    lines = [f"precision@5 - pseudo-label accuracy (points; goal >= +{summ['goal_points']:g}, median over the "
             f"evaluation shifts, i.e. all but {val}, the validation shift)", "",
             "| retriever | fraction | " + " | ".join(shifts) + " | median (evaluation) | median (all) | goal |",
             "|---|---|" + "---|" * (len(shifts) + 3)]
    for name, by_f in goal.items():
        for f in fractions:
            c = by_f[f]
            lines.append(f"| {name} | {f} | " + " | ".join(_pts(c["per_shift"].get(s)) for s in shifts)
                         + f" | {_pts(c['median_evaluation'])} | {_pts(c['median_all'])} | "
                         + ("met" if c["met"] else "not met") + " |")
    lines += ["", f"validation ({val}) keeps, by precision@5 among {', '.join(CHOOSABLE)}:", ""]
    for f, ch in summ["validation_choice"].items():
        lines.append(f"- at {f}: `{ch['retriever']}` ({_pct(ch['validation_precision_at_5'])} on {val}); on the "
                     f"evaluation shifts {_pts(ch['goal']['median_evaluation'])} points over the pseudo-labels "
                     f"(median), goal " + ("met" if ch["goal"]["met"] else "not met"))
    return "\n".join(lines) + "\n"


def _pts(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}"

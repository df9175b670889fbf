"""The mixed-pool grid (issue 52, item 3): the arms of :data:`t3ar_bench.retrieval.mixed_main.MIXED_ARMS` on every
(shift, seed, fraction) cell of a pool that looks like a team's, through the adaptation benchmark's arm runner.

The pool of a shift is the same for every seed (a team's store does not change with the run's seed): the icon
store, the clipart and every labelled emoji style outside the target's and the source's artwork families (at most
5 % of the pool). Runs are cached on disk, so the grid can be split over processes (``part``: this process runs
every ``n``-th cell) and gathered by a last call without a part, which runs nothing new.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from t3ar.embedder import Embedder, EmbedderSpec
from t3ar.models.backbones import PRESETS
from t3ar_bench.method.arms import make_arm
from t3ar_bench.method.data import BenchPool, EmbeddingStore, build_kits, side_table, source_model
from t3ar_bench.method.plans import CPU, BenchPlan
from t3ar_bench.method.runs import Context, arm_key, code_hash, load_targets, pool_name, run_arm, source_config
from t3ar_bench.retrieval.mixed_main import MIXED_ARMS, build_mixed

log = logging.getLogger(__name__)

#: what a grid record keeps of a run record
RECORD_FIELDS = ("phase", "shift", "seed", "fraction", "label", "method", "top1", "mean_class_accuracy", "steps",
                 "pool_images_fetched", "pool_labelled_items", "pool_used", "label_use", "pool_data", "holdout",
                 "seconds", "n_adapt", "n_eval", "cached")


def grid_plan(shifts: Sequence[str], seeds: Sequence[int], fractions: Sequence[float], *, max_steps: int,
              max_adapt: int | None, max_eval: int | None) -> BenchPlan:
    """The cpu plan's source model, schedule and holdouts on the given cells."""
    return dataclasses.replace(CPU, name="mixed", eval_shifts=tuple(shifts), extra_validation_shifts=(),
                               seeds=tuple(seeds), fractions=tuple(fractions), max_steps=max_steps,
                               max_adapt=max_adapt, max_eval=max_eval, workers=1, archive_styles=())


def grid_arms(shifts: Sequence[str], seeds: Sequence[int], fractions: Sequence[float],
              labels: Sequence[str] | None, pool_ids: dict[str, str], lr: float) -> list[dict[str, Any]]:
    """Every arm of every cell, seed by seed (then shift, fraction: a grid cut short holds whole seeds), in
    :data:`MIXED_ARMS` order. ``pool_ids`` names each shift's pool (part of the run's cache key: two pools never
    share a run)."""
    out = []
    for seed in seeds:
        for shift in shifts:
            for fraction in fractions:
                for label, method, draw, options in MIXED_ARMS:
                    if labels is None or label in labels:
                        out.append(make_arm("mixed", shift, seed, fraction, method, lr, label=label,
                                            options=options, pool_id=pool_ids[shift],
                                            **({"label_draw": draw} if draw else {})))
    return out


def run_mixed_grid(work: Path, cache: Path, icons: Path, *, shifts: Sequence[str], seeds: Sequence[int],
                   fractions: Sequence[float], arms: Sequence[str] | None = None, part: tuple[int, int] = (0, 1),
                   icon_cap: int | None = None, clipart_cap: int | None = None, max_steps: int = 40,
                   max_adapt: int | None = None, max_eval: int | None = None, lr: float = 1e-3,
                   cached_only: bool = False, device: torch.device | None = None) -> dict[str, Any]:
    """Run (or read from the cache) this part's share of the grid's runs; return every record it holds.
    ``cached_only``: run nothing, gather the runs already in the cache (a grid run in stages: the validation
    shift's arms first, the evaluation shifts' then)."""
    device = device or torch.device("cpu")
    t0 = time.perf_counter()
    plan = grid_plan(shifts, seeds, fractions, max_steps=max_steps, max_adapt=max_adapt, max_eval=max_eval)
    kits = build_kits(work, cache)
    source_set, targets = load_targets(plan, kits, list(shifts))
    sources = {s: source_model(work, source_set, source_config(plan, s), plan.image_size, kits.emoji_request, device)
               for s in seeds}
    embedder = Embedder(EmbedderSpec(backbone=PRESETS[plan.retrievers[0]], image_size=plan.retriever_size), device)
    store = EmbeddingStore(embedder, embedder.identity, work / "embeddings")
    pools: dict[str, tuple[Any, str]] = {}
    side: dict[str, tuple[str, str]] = {}
    summaries: dict[str, Any] = {}
    pool_ids: dict[str, str] = {}
    image_cache: dict[str, Any] = {}  # decoded pool images, shared between the shifts' pools
    for shift in shifts:
        pool = build_mixed(kits, icons, shift, icon_cap=icon_cap, clipart_cap=clipart_cap, seed=0)
        vectors = [store.component(c) for c in pool.components]
        tgt = targets[shift]
        bench_pool = BenchPool(embedder, pool.components, vectors, store.queries(tgt.style, tgt.adapt_idx),
                               image_cache)
        ids_hash = hashlib.sha256("\n".join(bench_pool.all_ids()).encode()).hexdigest()[:16]
        pool_ids[shift] = ids_hash
        pools[pool_name(shift, None, plan)] = (bench_pool, f"{store.tag}|mixed|{ids_hash}")
        side.update(side_table(pool.components))
        summaries[shift] = pool.summary()
        log.info("mixed pool for %s: %s", shift, {k: v for k, v in pool.summary().items() if k != "per_component"})
    t_pools = time.perf_counter()
    ctx = Context(plan, device, work / "mixed-grid", targets, sources, pools, side, code_hash())
    todo = grid_arms(shifts, seeds, fractions, arms, pool_ids, lr)
    index, count = part
    records = []
    for i, arm in enumerate(todo):
        if i % count != index:
            continue
        if cached_only and not (ctx.work / "method-runs" / f"{arm_key(ctx, arm)}.json").is_file():
            continue
        t = time.perf_counter()
        rec = run_arm(ctx, arm)
        if not rec.get("cached"):
            log.info("mixed %s %s seed %d %.0f %%: top-1 %.3f (%.0f s; run %d of %d)", arm["label"], arm["shift"],
                     arm["seed"], 100 * arm["fraction"], rec["top1"], time.perf_counter() - t, i + 1, len(todo))
        records.append({k: rec[k] for k in RECORD_FIELDS if k in rec})
    return {"shifts": list(shifts), "seeds": list(seeds), "fractions": list(fractions),
            "arms": [a[0] for a in MIXED_ARMS if arms is None or a[0] in arms], "pools": summaries,
            "plan": {"max_steps": max_steps, "max_adapt": max_adapt, "max_eval": max_eval, "lr": lr,
                     "source_epochs": plan.source_epochs, "k": plan.k, "image_size": plan.image_size,
                     "retriever": plan.retrievers[0], "retriever_size": plan.retriever_size,
                     "holdout_per_class": list(plan.holdout_per_class)},
            "part": list(part), "records": records,
            "seconds": {"pools": round(t_pools - t0, 1), "embedded_images": store.embedded,
                        "embed": round(store.seconds, 1), "runs": round(time.perf_counter() - t_pools, 1),
                        "run_seconds_total": round(sum(r.get("seconds", 0.0) for r in records), 1)}}

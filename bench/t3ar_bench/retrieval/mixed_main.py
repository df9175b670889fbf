"""The mixed-pool cell (issue 52, item 3): the arms on a pool that looks like a team's, run through the adaptation
benchmark's own arm runner (:func:`t3ar_bench.method.runs.run_arm`: the same source models, target splits, label
draws and caching as the grid).

Arms (one shift, seed and fraction per cell):

- ``source``, ``bn-adapt``, ``t3ar-noretrieval`` (no retrieval);
- ``t3ar`` and ``t3ar-random``: retrieval against uniform random draws, the pool's labels unused (the paper's
  claim and control);
- ``t3ar-labels``: T3AR with retrieval, its labelled neighbours as data (the product);
- ``t3ar-labels-class-conditional``: the same with class-conditional ranking (``retrieval.ranking``);
- ``t3ar-random-labels``: ``t3ar-random`` (uniform random draws from the whole pool, the paper's control), the
  labelled ones among them as data;
- ``t3ar-labels-random``: as many labelled items as retrieval gives, drawn uniformly from every labelled pool
  item (the class-matched random control: every labelled item is of the task's classes);
- ``t3ar-labels-all``: every labelled item of the model's classes in turn (the whole-pool reference);
- ``t3ar-labels-base-rerank``: ``t3ar-labels`` with the index's candidates re-ranked by the base model's features;
- ``t3ar-labels-balanced``, ``t3ar-labels-second-stage``: the recipe (item 4): the labelled term class-balanced;
  SWAT's second stage (bottleneck and head on the target alone) after the mixed fine-tune.

A smoke cell (minutes) shows the pipeline works on such a pool; its figures are not results.
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
from t3ar_bench.method.data import BenchPool, EmbeddingStore, build_kits, pool_components, side_table, source_model
from t3ar_bench.method.labelled_pool import pool_names
from t3ar_bench.method.plans import CPU, BenchPlan
from t3ar_bench.method.protocol import SOURCE_STYLE
from t3ar_bench.method.runs import Context, code_hash, load_targets, pool_name, run_arm, source_config
from t3ar_bench.retrieval.mixed_pool import MixedPool, compose, folder_components

log = logging.getLogger(__name__)

LABELS = {"pool_labels": {"weight": 1.0}}
#: (arm label, method, label draw, options)
MIXED_ARMS: tuple[tuple[str, str, str | None, dict[str, Any]], ...] = (
    ("source", "source", None, {}),
    ("bn-adapt", "bn-adapt", None, {}),
    ("t3ar-noretrieval", "t3ar-noretrieval", None, {}),
    ("t3ar", "t3ar", None, {}),
    ("t3ar-random", "t3ar-random", None, {}),
    ("t3ar-labels", "t3ar", "retrieved", LABELS),
    ("t3ar-labels-class-conditional", "t3ar", "retrieved", {**LABELS, "retrieval": {"ranking": "class-conditional"}}),
    ("t3ar-labels-base-rerank", "t3ar", "retrieved", {**LABELS, "retrieval": {"ranking": "base-rerank"}}),
    ("t3ar-random-labels", "t3ar-random", "retrieved", LABELS),
    ("t3ar-labels-random", "t3ar", "random", LABELS),
    ("t3ar-labels-all", "t3ar", "all", LABELS),
    # item 4, the recipe: the retrieved labelled items class-balanced, and SWAT's second stage after the fine-tune
    ("t3ar-labels-balanced", "t3ar", "retrieved", {"pool_labels": {"weight": 1.0, "balance": True}}),
    ("t3ar-labels-second-stage", "t3ar", "retrieved", {**LABELS, "second_stage": {"steps": 10}}),
)


def mixed_plan(shift: str, *, max_steps: int, max_adapt: int | None, max_eval: int | None) -> BenchPlan:
    """The cpu plan's source model and schedule, on one shift, capped for a cell."""
    return dataclasses.replace(CPU, name="mixed", eval_shifts=(shift,), extra_validation_shifts=(), seeds=(0,),
                               max_steps=max_steps, max_adapt=max_adapt, max_eval=max_eval, workers=1,
                               archive_styles=())


def build_mixed(kits: Any, icons: Path, shift: str, *, icon_cap: int | None, clipart_cap: int | None,
                seed: int) -> MixedPool:
    """The shift's mixed pool from the icon store, the pool kit's clipart and the kit's labelled emoji styles."""
    unrelated = folder_components(icons, cap=icon_cap, seed=seed)
    clip = pool_components(kits, [], clipart_cap, seed)
    kit_styles = [s for s in kits.emoji_request["styles"] if s != SOURCE_STYLE]
    emoji = pool_components(kits, [n for n in pool_names(shift, [], kit_styles, []) if n != SOURCE_STYLE], None,
                            seed)
    relevant = [c for n, c in emoji.items() if c.labels is not None]
    return compose([*unrelated, *clip.values()], relevant, seed=seed)


def run_mixed_cell(work: Path, cache: Path, icons: Path, *, shift: str, seed: int, fraction: float,
                   icon_cap: int | None, clipart_cap: int | None, max_steps: int, max_adapt: int | None,
                   max_eval: int | None, lr: float = 1e-3, arms: Sequence[str] | None = None,
                   device: torch.device | None = None) -> dict[str, Any]:
    device = device or torch.device("cpu")
    t0 = time.perf_counter()
    plan = mixed_plan(shift, max_steps=max_steps, max_adapt=max_adapt, max_eval=max_eval)
    kits = build_kits(work, cache)
    source_set, targets = load_targets(plan, kits, [shift])
    src = source_model(work, source_set, source_config(plan, seed), plan.image_size, kits.emoji_request, device)
    pool = build_mixed(kits, icons, shift, icon_cap=icon_cap, clipart_cap=clipart_cap, seed=seed)
    log.info("mixed pool for %s: %s", shift, pool.summary())
    t_pool = time.perf_counter()
    embedder = Embedder(EmbedderSpec(backbone=PRESETS[plan.retrievers[0]], image_size=plan.retriever_size), device)
    store = EmbeddingStore(embedder, embedder.identity, work / "embeddings")
    vectors = [store.component(c) for c in pool.components]
    tgt = targets[shift]
    bench_pool = BenchPool(embedder, pool.components, vectors, store.queries(tgt.style, tgt.adapt_idx), {})
    ids_hash = hashlib.sha256("\n".join(bench_pool.all_ids()).encode()).hexdigest()[:16]
    key = f"{store.tag}|mixed|{ids_hash}"
    t_embed = time.perf_counter()
    ctx = Context(plan, device, work / "mixed", targets, {seed: src}, {pool_name(shift, None, plan): (bench_pool, key)},
                  side_table(pool.components), code_hash())
    records = []
    for label, method, draw, options in MIXED_ARMS:
        if arms is not None and label not in arms:
            continue
        arm = make_arm("mixed", shift, seed, fraction, method, lr, label=label, options=options,
                       **({"label_draw": draw} if draw else {}))
        t = time.perf_counter()
        rec = run_arm(ctx, arm)
        log.info("mixed arm %s: top-1 %.3f (%.0f s)", label, rec["top1"], time.perf_counter() - t)
        records.append({k: rec.get(k) for k in ("label", "method", "top1", "mean_class_accuracy", "steps",
                                                 "pool_images_fetched", "pool_labelled_items", "label_use",
                                                 "seconds", "n_adapt", "n_eval")})
    return {"shift": shift, "seed": seed, "fraction": fraction, "pool": pool.summary(),
            "seconds": {"pool": round(t_pool - t0, 1), "embed": round(t_embed - t_pool, 1),
                        "embedded_images": store.embedded, "arms": round(time.perf_counter() - t_embed, 1)},
            "plan": {"max_steps": max_steps, "max_adapt": max_adapt, "max_eval": max_eval, "lr": lr,
                     "source_epochs": plan.source_epochs},
            "records": records, "note": "smoke cell: shows the pipeline works on a mixed pool; not results"}

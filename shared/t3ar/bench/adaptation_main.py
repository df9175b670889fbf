"""The adaptation benchmark's driver (``t3ar bench adapt``): data, source models, pools, the grid of runs,
ablations and diagnostics, then the report. Does retrieval help adaptation when target data is scarce?

Source f_S: trained on the Google emoji style. Targets: the Twitter, OpenMoji colour, OpenMoji black line-art
and Fluent 3D styles (4 shifts), labels = emoji subcategory. Pool A per shift: OpenClipart + Tux Paint + the
emoji styles that are neither the source nor the target. The protocol (fixed split, fractions, seeds,
schedule) is :class:`~t3ar.bench.adaptation_protocol.Plan`; the report states it. Writes
``adaptation.md``, ``adaptation.json`` (every run) and PNG plots (``adaptation-quick*`` for ``--quick``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch

from t3ar.bench.adaptation_data import (
    POOL_SOURCES,
    BenchPool,
    EmbeddingStore,
    build_kits,
    load_style,
    pool_components,
    side_table,
    source_model,
)
from t3ar.bench.adaptation_protocol import (
    SOURCE_STYLE,
    Plan,
    aggregate,
    cap_indices,
    fraction_subset,
    goal_verdict,
    retrieval_diagnostics,
    split_adapt_eval,
)
from t3ar.bench.adaptation_runs import Runner, Target
from t3ar.datakit.emoji import ALL_STYLES
from t3ar.embedder import Embedder, EmbedderSpec
from t3ar.method.config import AdaptConfig
from t3ar.method.supervised import TrainConfig
from t3ar.models.backbones import PRESETS

log = logging.getLogger(__name__)


def _retrievers(plan: Plan, device: torch.device, work: Path, clip_weights: Path | None,
                clip_model: str) -> dict[str, EmbeddingStore]:
    """The packaged ImageNet R (main), a random-init R (seeded) and, with weights, an open_clip CLIP R."""
    emb_dir = work / "embeddings"
    imagenet = Embedder(EmbedderSpec(image_size=plan.retriever_size), device)
    stores = {"imagenet": EmbeddingStore(imagenet, imagenet.identity, emb_dir)}
    torch.manual_seed(0)  # the random-init R is a fixed draw
    rand_spec = EmbedderSpec(backbone=PRESETS["efficientnet_lite0"].model_copy(update={"weights": "none"}),
                             image_size=plan.retriever_size)
    rand = Embedder(rand_spec, device)
    stores["random-init"] = EmbeddingStore(rand, rand.identity + "|init-seed=0", emb_dir)
    if clip_weights is not None:
        clip = Embedder(EmbedderSpec.parse(f"clip:{clip_model}", weights_path=str(clip_weights), image_size=224),
                        device)
        stores["clip"] = EmbeddingStore(clip, clip.identity, emb_dir)
    return stores


def run_adaptation_benchmark(plan: Plan, *, out_dir: Path, work: Path, cache: Path, device: torch.device,
                             clip_weights: Path | None = None, clip_model: str = "ViT-B-32",
                             fresh: bool = False) -> dict[str, Any]:
    """Run the whole benchmark of ``plan``; write the report, JSON and plots into ``out_dir``."""
    from t3ar.bench.adaptation_report import write_report

    t_start, load_start = time.perf_counter(), os.getloadavg()
    timings: dict[str, float] = {}
    kits = build_kits(work, cache)
    timings["data_kits"] = kits.seconds

    t0 = time.perf_counter()
    source_set = load_style(kits.emoji, SOURCE_STYLE, plan.image_size)
    targets: dict[str, Target] = {}
    for shift in plan.shifts:
        style = load_style(kits.emoji, shift, plan.image_size)
        if style.classes != source_set.classes:
            raise RuntimeError(f"{shift}: class list differs from the source style's")
        a, e = split_adapt_eval(style.labels.tolist(), plan.eval_share, plan.split_seed)
        targets[shift] = Target(shift, style, cap_indices(a, plan.max_adapt, plan.split_seed),
                                cap_indices(e, plan.max_eval, plan.split_seed))
    timings["load_styles"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    sources = {}
    for seed in sorted(set(plan.seeds) | set(plan.ablation_seeds)):
        tc = TrainConfig(epochs=plan.source_epochs, lr=plan.source_lr, batch_size=plan.batch_size,
                         train_groups=plan.train_groups, seed=seed)
        sources[seed] = source_model(work, source_set, tc, plan.image_size, kits.emoji_request, device)
    timings["source_models"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    stores = _retrievers(plan, device, work, clip_weights, clip_model)
    emoji_pool_styles = [s for s in ALL_STYLES if s != SOURCE_STYLE]
    comps = pool_components(kits, emoji_pool_styles, plan.pool_cap)
    side = side_table(list(comps.values()))
    image_cache: dict[str, Any] = {}

    def make_pool(store: EmbeddingStore, shift: str, with_emoji: bool, known: bool = True) -> tuple[BenchPool, str]:
        names = list(POOL_SOURCES) + ([s for s in emoji_pool_styles if s != shift] if with_emoji else [])
        vectors = [store.component(comps[n]) for n in names]
        tgt = targets[shift]
        queries = store.queries(tgt.style, tgt.adapt_idx) if known else {}
        pool = BenchPool(store.embedder, [comps[n] for n in names], vectors, queries, image_cache if known else {})
        ids_hash = hashlib.sha256("\n".join(pool.all_ids()).encode()).hexdigest()[:16]
        return pool, f"{store.tag}|{'+'.join(names)}|{ids_hash}"

    for store in stores.values():  # embed everything once up front (timed separately from the runs)
        for shift in plan.shifts:
            make_pool(store, shift, True)
    timings["embeddings"] = time.perf_counter() - t0
    reused = {"source_models": sum(float(m.metrics.get("seconds", 0.0)) for m in sources.values() if m.reused),
              "embeddings": sum(s.seconds_reused for s in stores.values())}

    runner = Runner(device, work / "runs", side, fresh=fresh)
    records: list[dict[str, Any]] = []
    adapted = [m for m in plan.methods if m != "source"]
    n_ablate = len(plan.ablation_ks) + 2 + ("clip" in stores)
    total = len(plan.shifts) * (len(plan.seeds) * len(plan.fractions) * len(adapted)
                                + len(plan.ablation_seeds) * n_ablate)
    t_runs = time.perf_counter()

    def cfg(method: str, seed: int, k: int | None = None) -> AdaptConfig:
        return AdaptConfig(method=method, k=plan.k if k is None else k, epochs=plan.epochs,  # type: ignore[arg-type]
                           min_steps=plan.min_steps, batch_size=plan.batch_size, lr=plan.lr,
                           train_groups=plan.train_groups, seed=seed)

    def add(rec: dict[str, Any], **tags: Any) -> None:
        records.append({**tags, **rec})
        done = sum(1 for r in records if r["method"] != "source")
        el = time.perf_counter() - t_runs
        log.info("[%d/%d] %s %s seed=%s f=%s %s: top1 %.1f%% (%s, %.0fs elapsed, ~%.0fs left)", done, total,
                 tags["variant"], tags["shift"], tags["seed"], tags["fraction"], rec["method"], 100 * rec["top1"],
                 "cached" if rec.get("cached") else f"{rec['seconds_adapt']:.0f}s", el,
                 el / max(1, done) * (total - done))

    for shift in plan.shifts:
        tgt = targets[shift]
        main_pool, main_key = make_pool(stores["imagenet"], shift, True)
        n_a = len(tgt.adapt_idx)
        for seed in plan.seeds:
            src_acc = runner.evaluate_source(sources[seed], tgt)
            for fraction in plan.fractions:
                records.append({"variant": "main", "shift": shift, "seed": seed, "fraction": fraction,
                                "method": "source", "k": 0, "n_adapt": 0, "n_eval": len(tgt.eval_idx), **src_acc})
                subset = [tgt.adapt_idx[i] for i in fraction_subset(n_a, fraction, seed)]
                for method in adapted:
                    rec = runner.run(sources[seed], tgt, subset, cfg(method, seed), provider=main_pool,
                                     pool_key=main_key)
                    add(rec, variant="main", shift=shift, seed=seed, fraction=fraction)
        for seed in plan.ablation_seeds:
            f = plan.ablation_fraction
            subset = [tgt.adapt_idx[i] for i in fraction_subset(n_a, f, seed)]
            tags = {"shift": shift, "seed": seed, "fraction": f}
            for k in plan.ablation_ks:
                add(runner.run(sources[seed], tgt, subset, cfg("t3ar", seed, k), provider=main_pool,
                               pool_key=main_key), variant=f"k={k}", **tags)
            variants = [("pool: clipart only", "imagenet", False), ("retriever: random-init", "random-init", True)]
            variants += [("retriever: CLIP", "clip", True)] if "clip" in stores else []
            for variant, store_name, with_emoji in variants:
                pool, key = make_pool(stores[store_name], shift, with_emoji)
                add(runner.run(sources[seed], tgt, subset, cfg("t3ar", seed), provider=pool, pool_key=key),
                    variant=variant, **tags)
    timings["runs"] = time.perf_counter() - t_runs

    t0 = time.perf_counter()
    diagnostics: list[dict[str, Any]] = []
    k_cand = plan.k * AdaptConfig().r
    for shift in plan.shifts:
        tgt = targets[shift]
        labels, items = tgt.style.label_names(tgt.adapt_idx), [tgt.style.items[i] for i in tgt.adapt_idx]
        for store_name, store in stores.items():
            for with_emoji in (True, False):
                pool, _ = make_pool(store, shift, with_emoji)
                _, cand = pool.search(pool.embed(tgt.style.images[tgt.adapt_idx]), k_cand)
                pool_labels = [side[i] for i in pool.all_ids() if i in side]
                for depth in (1, k_cand):
                    d = retrieval_diagnostics([row[:depth] for row in cand], labels, items, side,
                                              [lab for lab, _ in pool_labels])
                    diagnostics.append({"shift": shift, "retriever": store_name, "pool_with_emoji": with_emoji,
                                        "depth": depth, **d.as_dict()})
    timings["diagnostics"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_start

    results: dict[str, Any] = {
        "plan": plan.as_dict(), "quick": plan.name == "quick", "device": str(device),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                    "threads": torch.get_num_threads(), "loadavg_start": load_start, "loadavg_end": os.getloadavg()},
        "data": {"classes": len(source_set.classes), "source_images": len(source_set.items),
                 "targets": {s: {"adapt": len(t.adapt_idx), "eval": len(t.eval_idx)} for s, t in targets.items()},
                 "pool_components": {n: len(c.ids) for n, c in comps.items()}},
        "retrievers": {n: s.tag for n, s in stores.items()},
        "source_models": {str(s): {"sha256": m.sha256, "reused": m.reused, **m.metrics} for s, m in sources.items()},
        "timings": timings, "timings_reused_from_cache": reused,
        "runs_executed": runner.ran, "runs_reused": runner.reused,
        "embedding_seconds_per_image": {n: s.seconds / s.embedded for n, s in stores.items() if s.embedded},
        "diagnostics": diagnostics, "aggregate": aggregate(records), "records": records,
    }
    results["verdict"] = goal_verdict(results["aggregate"])
    write_report(results, out_dir, stem="adaptation-quick" if plan.name == "quick" else "adaptation")
    return results

"""One run of the adaptation benchmark (retrieve -> adapt -> evaluate) with an on-disk result cache, and the
side-by-side speed measurement (plain supervised step vs AdaContrast vs T3AR on the same model and batch).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from t3ar.bench.adaptation_data import BenchPool, SourceModel, StyleSet
from t3ar.bench.adaptation_protocol import retrieval_diagnostics
from t3ar.device import seed_everything
from t3ar.method.adapt import StepStats, adapt
from t3ar.method.augment import Normalizer
from t3ar.method.config import AdaptConfig
from t3ar.method.evaluate import evaluate
from t3ar.method.schedule import steps_per_epoch
from t3ar.method.supervised import TrainConfig, train_supervised
from t3ar.pipeline import retrieve

log = logging.getLogger(__name__)


@dataclass
class Target:
    """A shift: the target style, its fixed adaptation part and its held-out evaluation part."""

    shift: str
    style: StyleSet
    adapt_idx: list[int]  # indices into ``style``
    eval_idx: list[int]

    @property
    def eval_x(self) -> torch.Tensor:
        return self.style.images[self.eval_idx]

    @property
    def eval_y(self) -> torch.Tensor:
        return self.style.labels[self.eval_idx]


def _key(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def code_hash() -> str:
    """Hash of the code a run's result depends on (the method, models, harness): part of the cache key."""
    import t3ar

    root = Path(t3ar.__file__).parent
    h = hashlib.sha256()
    for path in sorted([*root.joinpath("method").glob("*.py"), *root.joinpath("models").glob("*.py"),
                        root / "pipeline.py"]):
        h.update(path.read_bytes())
    return h.hexdigest()


class Runner:
    """Runs and caches single adaptations. A cached result is reused when every input is the same."""

    def __init__(self, device: torch.device, cache_dir: Path, side: Mapping[str, tuple[str, str]], *,
                 fresh: bool = False) -> None:
        self.device = device
        self.cache_dir = cache_dir
        self.side = side
        self.fresh = fresh
        self.ran = 0
        self.reused = 0
        self.code = code_hash()

    def _norm(self, source: SourceModel) -> Normalizer:
        return Normalizer(source.spec.backbone.mean, source.spec.backbone.std, self.device)

    def evaluate_source(self, source: SourceModel, target: Target) -> dict[str, Any]:
        rep = evaluate(source.model, target.eval_x, target.eval_y, source.spec.classes, self._norm(source))
        return {"top1": rep["top1"], "mean_class_accuracy": rep["mean_class_accuracy"]}

    def run(self, source: SourceModel, target: Target, subset: Sequence[int], config: AdaptConfig, *,
            provider: BenchPool | None, pool_key: str | None) -> dict[str, Any]:
        """Adapt a copy of the source model on ``target.style[subset]``; evaluate on the held-out part."""
        style = target.style
        key = _key({"code": self.code, "config": config.model_dump(), "source": source.sha256, "shift": target.shift,
                    "adapt": [style.items[i] for i in subset], "eval": [style.items[i] for i in target.eval_idx],
                    "size": list(style.images.shape[1:]), "pool": pool_key if config.uses_retrieval else None})
        path = self.cache_dir / f"{key[:24]}.json"
        if path.is_file() and not self.fresh:
            self.reused += 1
            return {**json.loads(path.read_text()), "cached": True}
        model = copy.deepcopy(source.model)
        gen = seed_everything(config.seed)
        x = style.images[list(subset)]
        t0 = time.perf_counter()
        retrieved = retrieve(provider, x, config, source.spec.image_size, gen) \
            if (config.uses_retrieval and provider is not None) else None
        t_retrieve = time.perf_counter() - t0
        res = adapt(model, x, config, mean=source.spec.backbone.mean, std=source.spec.backbone.std,
                    neighbours=retrieved.neighbours if retrieved else None,
                    pool_images=retrieved.pool_images if retrieved else None, device=self.device, generator=gen)
        rep = evaluate(model, target.eval_x, target.eval_y, source.spec.classes, self._norm(source))
        record: dict[str, Any] = {
            "method": config.method, "k": config.k if config.uses_retrieval else 0, "n_adapt": len(subset),
            "n_eval": len(target.eval_idx), "steps": res.steps, "epochs": res.epochs,
            "seconds_adapt": res.seconds, "seconds_per_epoch": res.seconds_per_epoch,
            "seconds_retrieval": t_retrieve, "top1": rep["top1"], "mean_class_accuracy": rep["mean_class_accuracy"],
            "pool": pool_key if retrieved else None, "pool_size": provider.size() if (retrieved and provider) else 0,
            "pool_images_fetched": len(retrieved.pool_ids) if retrieved else 0, "pool_used": len(res.pool_used),
            "retriever": provider.identity if (retrieved and provider) else None,
        }
        if retrieved is not None:
            record["retrieval_seconds"] = {"embed": retrieved.seconds_embed, "search": retrieved.seconds_search,
                                           "fetch": retrieved.seconds_fetch}
            nbrs = [[retrieved.pool_ids[j] if j >= 0 else "" for j in row.tolist()] for row in retrieved.neighbours]
            record["neighbours"] = retrieval_diagnostics(
                nbrs, style.label_names(subset), [style.items[i] for i in subset], self.side).as_dict()
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=1))
        tmp.replace(path)
        self.ran += 1
        return {**record, "cached": False}


def _timed(run: Any) -> tuple[list[float], list[float], list[StepStats]]:
    """Call ``run(on_step)``; per step (between consecutive callbacks): wall seconds, process CPU seconds, stats.

    The first step's interval also covers the run's set-up (model copy, bank initialisation): callers drop it.
    """
    stamps: list[tuple[float, float]] = []
    stats: list[StepStats] = []

    def on_step(s: StepStats) -> None:
        stamps.append((time.perf_counter(), time.process_time()))
        stats.append(s)

    start = (time.perf_counter(), time.process_time())
    run(on_step)
    pairs = list(zip([start] + stamps[:-1], stamps, strict=True))
    return [b[0] - a[0] for a, b in pairs], [b[1] - a[1] for a, b in pairs], stats


def _summary(walls: list[float], cpus: list[float], stats: list[StepStats], batch: int,
             steps_full_epoch: int) -> dict[str, Any]:
    step = statistics.median(walls)
    cpu = statistics.median(cpus)
    aug = statistics.mean(x.seconds_augment for x in stats)
    bank = statistics.mean(x.seconds_bank for x in stats)
    fb = statistics.mean(x.seconds_forward_backward for x in stats) - bank
    return {"steps_timed": len(walls), "step_seconds_median": step, "step_seconds_mean": statistics.mean(walls),
            "cpu_seconds_median": cpu, "images_per_second": batch / step, "seconds_per_epoch": step * steps_full_epoch,
            "breakdown_seconds": {"augment": aug, "forward_backward": fb, "bank": bank,
                                  "other": max(0.0, statistics.mean(walls) - aug - fb - bank)}}


def measure_speed(source: SourceModel, target: Target, provider: BenchPool, *, k: int, lr: float,
                  batch_size: int, train_groups: int, n_images: int | None, rounds: int,
                  device: torch.device) -> dict[str, Any]:
    """Supervised, AdaContrast and T3AR steps on the same model, images and batch size, interleaved.

    Each round runs one short epoch (``n_images`` of the adaptation part) of each method in turn, so that
    a change in machine load hits all three alike; the first step of every run (which includes its set-up)
    is not timed. Wall time and process CPU time are both recorded: on a shared machine the CPU-time ratio
    is the better estimate of the unshared one. ``provider`` must not have query embeddings precomputed (so
    the retrieval time is real); retrieval is timed once per T3AR run, outside the steps.
    """
    style = target.style
    idx = target.adapt_idx if n_images is None else target.adapt_idx[:n_images]
    x, y = style.images[idx], style.labels[idx]
    spec = source.spec
    mean, std = spec.backbone.mean, spec.backbone.std
    full_spe = steps_per_epoch(len(target.adapt_idx), batch_size)
    walls: dict[str, list[float]] = {"supervised": [], "adacontrast": [], "t3ar": []}
    cpus: dict[str, list[float]] = {m: [] for m in walls}
    stats: dict[str, list[StepStats]] = {m: [] for m in walls}
    retrieval: list[dict[str, float]] = []
    for r in range(rounds):
        for method in walls:
            model = copy.deepcopy(source.model)
            gen = seed_everything(100 + r)
            if method == "supervised":
                tc = TrainConfig(epochs=1, lr=lr, batch_size=batch_size, train_groups=train_groups, seed=r)
                w, c, s = _timed(lambda cb, m=model, g=gen, c=tc: train_supervised(
                    m, x, y, c, mean=mean, std=std, device=device, generator=g, on_step=cb))
            else:
                cfg = AdaptConfig(method=method, k=k, epochs=1, lr=lr, batch_size=batch_size,  # type: ignore[arg-type]
                                  train_groups=train_groups, seed=r)
                ret = None
                if cfg.uses_retrieval:
                    provider.clear_image_cache()  # fetching (decoding) is part of retrieval
                    ret = retrieve(provider, x, cfg, spec.image_size, gen)
                    retrieval.append({"embed": ret.seconds_embed, "search": ret.seconds_search,
                                      "fetch": ret.seconds_fetch, "pool_images": float(len(ret.pool_ids))})
                w, c, s = _timed(lambda cb, m=model, g=gen, c=cfg, rt=ret: adapt(
                    m, x, c, mean=mean, std=std, neighbours=rt.neighbours if rt else None,
                    pool_images=rt.pool_images if rt else None, device=device, generator=g, on_step=cb))
            walls[method] += w[1:]
            cpus[method] += c[1:]
            stats[method] += s[1:]
            log.info("speed round %d %s: median step %.3f s wall, %.3f s CPU", r, method, statistics.median(w[1:]),
                     statistics.median(c[1:]))
    out: dict[str, Any] = {"images": len(idx), "batch_size": batch_size, "k": k, "rounds": rounds,
                           "steps_per_full_epoch": full_spe, "n_adapt_full": len(target.adapt_idx),
                           "shift": target.shift, "device": str(device)}
    for method in walls:
        out[method] = _summary(walls[method], cpus[method], stats[method], batch_size, full_spe)
    ret_mean = {key: statistics.mean(d[key] for d in retrieval) for key in retrieval[0]} if retrieval else {}
    n_q = len(idx)
    ret_s = sum(v for key, v in ret_mean.items() if key != "pool_images")
    out["t3ar"]["retrieval"] = {**ret_mean, "seconds_total": ret_s, "queries": n_q,
                                "seconds_per_step": ret_s / max(1, steps_per_epoch(n_q, batch_size)),
                                "seconds_per_full_epoch_equiv": ret_s * len(target.adapt_idx) / max(1, n_q)}
    sup, sup_cpu = out["supervised"]["step_seconds_median"], out["supervised"]["cpu_seconds_median"]
    out["throughput_ratio"] = {m: sup / out[m]["step_seconds_median"] for m in ("adacontrast", "t3ar")}
    out["throughput_ratio_cpu"] = {m: sup_cpu / out[m]["cpu_seconds_median"] for m in ("adacontrast", "t3ar")}
    out["throughput_ratio_with_retrieval"] = sup / (out["t3ar"]["step_seconds_median"]
                                                    + out["t3ar"]["retrieval"]["seconds_per_step"])
    return out

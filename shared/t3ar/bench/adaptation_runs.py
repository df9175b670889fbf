"""One run of the adaptation benchmark (retrieve -> adapt -> evaluate) with an on-disk result cache, and the
side-by-side speed measurement (plain supervised step vs AdaContrast vs T3AR on the same model and batch).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
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
from t3ar.pipeline import Retrieved, retrieve

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


StepFn = Callable[[StepStats], None]


def interleaved(runs: Mapping[str, Callable[[StepFn], object]]) -> dict[str, tuple[list[float], list[float],
                                                                                 list[StepStats]]]:
    """Run training loops in lock-step — one step of each in turn — and time every step.

    Each ``runs[name](on_step)`` runs in its own thread, but a baton passed in ``on_step`` lets only one of
    them compute at any time, so a change in machine load affects all of them alike. Returns, per run, the
    wall and process-CPU seconds of each step and its stats; the first step (which also covers the run's
    set-up, e.g. the bank initialisation) is dropped. Exceptions are re-raised after every thread finished.
    """
    names = list(runs)
    cond = threading.Condition()
    current: list[str | None] = [names[0] if names else None]
    done: set[str] = set()
    out: dict[str, tuple[list[float], list[float], list[StepStats]]] = {n: ([], [], []) for n in names}
    errors: list[BaseException] = []

    def following(name: str) -> str | None:
        i = names.index(name)
        return next((c for j in range(1, len(names) + 1) if (c := names[(i + j) % len(names)]) not in done), None)

    def worker(name: str) -> None:
        resumed = [0.0, 0.0]

        def take_turn() -> None:
            with cond:
                cond.wait_for(lambda: current[0] == name)
            resumed[:] = [time.perf_counter(), time.process_time()]

        def on_step(stats: StepStats) -> None:
            walls, cpus, all_stats = out[name]
            walls.append(time.perf_counter() - resumed[0])
            cpus.append(time.process_time() - resumed[1])
            all_stats.append(stats)
            with cond:
                current[0] = following(name)
                cond.notify_all()
            take_turn()

        try:
            take_turn()
            runs[name](on_step)
        except BaseException as exc:  # noqa: B036 - re-raised in the caller's thread
            errors.append(exc)
        finally:
            with cond:
                done.add(name)
                if current[0] == name:
                    current[0] = following(name)
                cond.notify_all()

    threads = [threading.Thread(target=worker, args=(n,), name=f"speed-{n}") for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return {n: (w[1:], c[1:], st[1:]) for n, (w, c, st) in out.items()}


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


def _supervised_run(source: SourceModel, x: torch.Tensor, y: torch.Tensor, cfg: TrainConfig,
                    device: torch.device) -> Callable[[StepFn], object]:
    def run(on_step: StepFn) -> object:
        b = source.spec.backbone
        return train_supervised(copy.deepcopy(source.model), x, y, cfg, mean=b.mean, std=b.std, device=device,
                                generator=seed_everything(100 + cfg.seed), on_step=on_step)

    return run


def _adapt_run(source: SourceModel, x: torch.Tensor, cfg: AdaptConfig, ret: Retrieved | None,
               device: torch.device) -> Callable[[StepFn], object]:
    def run(on_step: StepFn) -> object:
        b = source.spec.backbone
        return adapt(copy.deepcopy(source.model), x, cfg, mean=b.mean, std=b.std,
                     neighbours=ret.neighbours if ret else None, pool_images=ret.pool_images if ret else None,
                     device=device, generator=seed_everything(100 + cfg.seed), on_step=on_step)

    return run


def measure_speed(source: SourceModel, target: Target, provider: BenchPool, *, k: int, lr: float,
                  batch_size: int, train_groups: int, n_images: int | None, rounds: int,
                  device: torch.device) -> dict[str, Any]:
    """Supervised, AdaContrast and T3AR steps on the same model, images and batch size, interleaved.

    Each round runs one short epoch (``n_images`` of the adaptation part) of the three methods in lock-step
    (:func:`interleaved`: one step of each in turn), so that a change in machine load hits all three alike;
    the first step of every run (which includes its set-up) is not timed. Wall and process CPU time are both
    recorded. ``provider`` must not have query embeddings precomputed (so the retrieval time is real);
    retrieval is timed once per T3AR run, outside the steps.
    """
    style = target.style
    idx = target.adapt_idx if n_images is None else target.adapt_idx[:n_images]
    x, y = style.images[idx], style.labels[idx]
    spec = source.spec
    full_spe = steps_per_epoch(len(target.adapt_idx), batch_size)
    walls: dict[str, list[float]] = {"supervised": [], "adacontrast": [], "t3ar": []}
    cpus: dict[str, list[float]] = {m: [] for m in walls}
    stats: dict[str, list[StepStats]] = {m: [] for m in walls}
    retrieval: list[dict[str, float]] = []
    for r in range(rounds):
        tc = TrainConfig(epochs=1, lr=lr, batch_size=batch_size, train_groups=train_groups, seed=r)
        runs: dict[str, Callable[[StepFn], object]] = {"supervised": _supervised_run(source, x, y, tc, device)}
        for method in ("adacontrast", "t3ar"):
            cfg = AdaptConfig(method=method, k=k, epochs=1, lr=lr, batch_size=batch_size,
                              train_groups=train_groups, seed=r)
            ret = None
            if cfg.uses_retrieval:
                provider.clear_image_cache()  # fetching (decoding) is part of retrieval
                ret = retrieve(provider, x, cfg, spec.image_size, seed_everything(100 + r))
                retrieval.append({"embed": ret.seconds_embed, "search": ret.seconds_search,
                                  "fetch": ret.seconds_fetch, "pool_images": float(len(ret.pool_ids))})
            runs[method] = _adapt_run(source, x, cfg, ret, device)
        for method, (w, c, st) in interleaved(runs).items():
            walls[method] += w
            cpus[method] += c
            stats[method] += st
            log.info("speed round %d %s: median step %.3f s wall, %.3f s CPU", r, method, statistics.median(w),
                     statistics.median(c))
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

"""One run of the adaptation benchmark (retrieve -> adapt -> evaluate) with an on-disk result cache. Step speed
is measured by ``t3ar bench speed`` (:mod:`t3ar.bench.speed`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from t3ar.bench.adaptation_data import BenchPool, SourceModel, StyleSet
from t3ar.bench.adaptation_protocol import retrieval_diagnostics
from t3ar.device import seed_everything
from t3ar.method.adapt import adapt
from t3ar.method.augment import Normalizer
from t3ar.method.config import AdaptConfig
from t3ar.method.evaluate import evaluate
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

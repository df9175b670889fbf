"""The stream: for every seed and arm, each target style in order is adapted from the base model, evaluated
on its held-out images, and (growing arms) then contributed to the arm's pool folder by the real mechanism.

Pool embeddings are computed once per file content (sha256) and shared by every arm and seed: R is fixed, so a
pool folder's index is rebuilt from cached vectors at every step instead of re-embedding it.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from t3ar.curation import plan_removals
from t3ar.data.datasets import ImageSet, read_unlabelled
from t3ar.data.images import open_image
from t3ar.embedder import Embedder
from t3ar.local_contribute import contribute_local
from t3ar.local_pool import LocalPool
from t3ar_bench.continual.plan import ARMS, ContinualPlan, arm_config

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Step:
    style: str
    adapt: ImageSet  # adapted on, then contributed (labels used for nothing but the report)
    evaluation: ImageSet  # held out: accuracy after the step


class VectorCache:
    """R's vector of each file content, computed once."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self._by_sha: dict[str, np.ndarray] = {}

    def vectors(self, paths: Sequence[Path]) -> np.ndarray:
        shas = [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]
        todo = [(p, s) for p, s in zip(paths, shas, strict=True) if s not in self._by_sha]
        for start in range(0, len(todo), 128):
            chunk = todo[start:start + 128]
            vecs = self.embedder.embed([open_image(p) for p, _ in chunk], batch_size=128)
            self._by_sha.update({s: v for (_, s), v in zip(chunk, vecs, strict=True)})
        return np.stack([self._by_sha[s] for s in shas]) if shas else np.empty((0, 1), dtype=np.float32)

    def pool(self, folder: Path) -> LocalPool:
        items = read_unlabelled(folder)
        return LocalPool(self.embedder, items.paths, items.ids, self.vectors(items.paths))


def compact_folder(folder: Path, cache: VectorCache, threshold: float) -> int:
    """Curation: remove near-duplicates among the contributed targets (``target-*`` folders) of a pool folder;
    the base pool is never touched. Returns how many files were removed."""
    pool = read_unlabelled(folder)
    removable = np.array([i.startswith("target-") for i in pool.ids], dtype=bool)
    plan = plan_removals(cache.vectors(pool.paths), removable, threshold)
    for r in plan.removals:
        pool.paths[r.row].unlink()
    return len(plan.removals)


def _sha12(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def _what_r_retrieves(provider: LocalPool, cache: VectorCache, step: Step, k: int,
                      known: Mapping[str, tuple[str, str]]) -> dict[str, float]:
    """A diagnostic of R alone (plain top-k, before the method's dedup and threshold): the share of the step's
    adaptation images' k nearest pool items that are past targets, and of those, the share in the query's class
    and the share that are the same emoji (in an earlier style). Past targets are recognised by their contributed
    file name (``<n>-<sha256[:12]>.png``); ``known`` maps that sha prefix to (class, emoji)."""
    assert step.adapt.labels is not None and step.adapt.classes is not None
    _, ids = provider.search(cache.vectors(step.adapt.paths), k)
    total = past = same_class = same_emoji = 0
    for path, label, row in zip(step.adapt.paths, step.adapt.labels, ids, strict=True):
        for pid in row:
            if not pid:
                continue
            total += 1
            if not pid.startswith("target-"):
                continue
            past += 1
            cls, emoji = known.get(Path(pid).stem.split("-", 1)[-1], ("", ""))
            same_class += cls == step.adapt.classes[label]
            same_emoji += emoji == path.stem
    return {"r_past_share": past / total if total else 0.0,
            "r_past_same_class": same_class / past if past else float("nan"),
            "r_past_same_emoji": same_emoji / past if past else float("nan")}


def run_stream(plan: ContinualPlan, steps: Sequence[Step], base_model: Path, base_pool: Path,
               selection: Mapping[str, Any], work: Path, embedder: Embedder, device: Any,
               arms: Sequence[str] = ARMS, progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """One record per (seed, arm, step): accuracy before/after, pool size, share of neighbours from past
    targets, what the step contributed and what curation removed."""
    import torch

    from t3ar.method.config import PROBE_SWITCHES, AdaptConfig
    from t3ar.method.probe import Probe
    from t3ar.models.checkpoint import load_checkpoint
    from t3ar.pipeline import run_adaptation

    cache = VectorCache(embedder)
    known: dict[str, tuple[str, str]] = {}  # sha256[:12] of every adaptation image → (class, emoji): diagnostics
    for step in steps:
        assert step.adapt.labels is not None and step.adapt.classes is not None
        for path, label in zip(step.adapt.paths, step.adapt.labels, strict=True):
            known[_sha12(path)] = (step.adapt.classes[label], path.stem)
    records: list[dict[str, Any]] = []
    for seed in plan.seeds:
        for arm in arms:
            folder = work / f"pool-{arm}-s{seed}"
            shutil.rmtree(folder, ignore_errors=True)
            shutil.copytree(base_pool, folder)
            for t, step in enumerate(steps):
                t0 = time.perf_counter()
                torch.manual_seed(seed)
                model, info = load_checkpoint(base_model, device=device)  # every step from the base model
                fields = arm_config(plan, selection, arm, seed, len(step.adapt))
                # the switches out of the product (e.g. an earlier selection's redraw_neighbours): the probe's
                switches = {k: fields.pop(k) for k in PROBE_SWITCHES if k in fields}
                cfg = AdaptConfig.model_validate(fields)
                provider = cache.pool(folder) if arm != "none" else None
                outcome = run_adaptation(model, info, step.adapt, cfg, provider=provider, device=device,
                                         eval_set=step.evaluation, probe=Probe(**switches) if switches else None)
                used = list(outcome.lineage.pool_ids)
                past = sum(p.startswith("target-") for p in used)
                rec: dict[str, Any] = {
                    "seed": seed, "arm": arm, "step": t, "style": step.style,
                    "top1": float(outcome.after["top1"]) if outcome.after else None,  # type: ignore[arg-type]
                    "top1_before": float(outcome.before["top1"]) if outcome.before else None,  # type: ignore[arg-type]
                    "pool_size": provider.size() if provider is not None else 0,
                    "past_target_items": sum(i.startswith("target-") for i in provider.all_ids()) if provider else 0,
                    "neighbours_used": len(used), "past_target_share": past / len(used) if used else 0.0,
                    "steps": outcome.result.steps}
                if provider is not None:
                    rec.update(_what_r_retrieves(provider, cache, step, plan.k, known))
                if arm in ("growing", "curated"):
                    c = contribute_local(folder, list(step.adapt.paths), f"{step.style}-s{seed}",
                                         provider or cache.pool(folder), threshold=plan.duplicate_threshold)
                    rec["contributed"] = {k: c[k] for k in ("added", "skipped_exact", "skipped_near")}
                    if arm == "curated":
                        rec["curated_removed"] = compact_folder(folder, cache, plan.compact_threshold)
                rec["seconds"] = round(time.perf_counter() - t0, 2)
                records.append(rec)
                if progress is not None:
                    progress(f"seed {seed} {arm:8s} step {t} ({step.style}): top-1 {rec['top1']:.3f}, pool "
                             f"{rec['pool_size']}, past-target neighbours {rec['past_target_share']:.0%}")
    return records

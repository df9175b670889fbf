"""Runs of the method benchmark: the shared context (data, source models, pools) and one paired run.

A run is described by a JSON-able *arm* (phase, shift, seed, fraction, method, mode, lr, k, options) and
returns a JSON-able record. Runs are cached on disk (keyed by the code, the arm and its data), and can
be spread over worker processes (each builds the context once from the caches the parent filled).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from t3ar.data.images import to_tensor_uint8
from t3ar.datakit.archive import ARCHIVE_STYLES
from t3ar.datakit.emoji import DEFAULT_STYLES
from t3ar.device import seed_everything
from t3ar.embedder import Embedder, EmbedderSpec
from t3ar.method import config as method_config
from t3ar.method.adapt import StepStats, adapt, stream
from t3ar.method.augment import Normalizer
from t3ar.method.config import AdaptConfig, adapt_config
from t3ar.method.evaluate import evaluate
from t3ar.method.probe import PROBE_SWITCHES, Probe
from t3ar.method.retrieval import NeighbourProvider
from t3ar.method.schedule import steps_per_epoch
from t3ar.method.selection import criteria, soft_neighbourhood_density
from t3ar.method.supervised import TrainConfig, train_supervised
from t3ar.models.backbones import PRESETS
from t3ar.pipeline import retrieve
from t3ar.retrieval_ranking import RankContext
from t3ar_bench.method.data import (
    POOL_SOURCES,
    BenchPool,
    Component,
    EmbeddingStore,
    Kits,
    SourceModel,
    StyleSet,
    build_kits,
    load_style,
    pool_components,
    side_table,
    source_model,
)
from t3ar_bench.method.label_use import label_use
from t3ar_bench.method.labelled_pool import pool_names
from t3ar_bench.method.plans import BenchPlan, validation_shifts
from t3ar_bench.method.protocol import SOURCE_STYLE, cap_indices, fraction_subset, holdout_indices, split_adapt_eval

log = logging.getLogger(__name__)
CURVE_FIELDS = ("loss", "loss_ce", "loss_contrastive", "loss_diversity", "pl_accuracy", "pool_neg_share",
                "grad_norm_ce", "grad_norm_contrastive", "pl_change_rate", "lr", "pool_data_count",
                "pool_data_correct")


def pool_data_summary(history: Sequence[StepStats]) -> dict[str, float]:
    """Neighbours as data over a run: the mean number that served per step, the mean number with a known label
    (other emoji styles), and the share of those whose pseudo-label was right (side labels: reporting only; the
    T3AR family's record, :class:`t3ar.method.contrastive.T3ARStepStats`)."""
    rows = [(getattr(h, "pool_data_count", math.nan), getattr(h, "pool_data_known", math.nan),
             getattr(h, "pool_data_correct", math.nan)) for h in history]
    count = [c for c, _, _ in rows if not math.isnan(c)]
    known = [k for _, k, _ in rows if not math.isnan(k)]
    right = sum(r * k for _, k, r in rows if not math.isnan(r) and not math.isnan(k))
    return {"per_step": statistics.mean(count) if count else 0.0,
            "known_per_step": statistics.mean(known) if known else 0.0,
            "correct_share": right / sum(known) if sum(known) else math.nan}


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


def code_hash() -> str:
    """Hash of the code a run's result depends on (the method, models, harness): part of the cache key."""
    import t3ar

    root = Path(t3ar.__file__).parent
    h = hashlib.sha256()
    for path in sorted([*root.joinpath("method").glob("*.py"), *root.joinpath("models").glob("*.py"),
                        root / "pipeline.py", root / "retrieval_ranking.py"]):
        h.update(path.read_bytes())
    return h.hexdigest()


@dataclass
class Context:
    plan: BenchPlan
    device: torch.device
    work: Path
    targets: dict[str, Target]
    sources: dict[int, SourceModel]
    pools: dict[str, tuple[NeighbourProvider, str]]  # a BenchPool, or a precomputed one (t3ar_bench.method.pack)
    side: dict[str, tuple[str, str]]
    code: str


def archive_needed(plan: BenchPlan) -> tuple[str, ...]:
    """The archive styles a plan's kits must hold: its pool's and those of its shifts (validation and evaluation)
    that are archive styles, in that order."""
    shifts = [s for s in (*validation_shifts(plan), *plan.eval_shifts) if s in ARCHIVE_STYLES]
    return tuple(dict.fromkeys([*plan.archive_styles, *shifts]))


def pool_name(shift: str, retriever: str | None, plan: BenchPlan) -> str:
    """The key of a shift's pool as embedded by ``retriever`` (a backbone preset; None = the plan's default R)."""
    return f"{shift}|{retriever or plan.retrievers[0]}"


def load_targets(plan: BenchPlan, kits: Kits, shifts: Sequence[str] | None = None
                 ) -> tuple[StyleSet, dict[str, Target]]:
    """The source style and each shift's target (default: the validation shift and the evaluation shifts) with its
    fixed adaptation/evaluation split (:func:`split_adapt_eval`, capped as the plan says), at ``plan.image_size``.
    Raises RuntimeError when a target's class list differs from the source's."""
    source_set = load_style(kits.emoji, SOURCE_STYLE, plan.image_size)
    targets: dict[str, Target] = {}
    for shift in (shifts if shifts is not None else (*validation_shifts(plan), *plan.eval_shifts)):
        if shift in ARCHIVE_STYLES:  # an archive style: the emoji it has, labelled with the task's classes
            if kits.archive is None:
                raise RuntimeError(f"{shift} is an archive style, but the kits were built without the archive")
            style = load_style(kits.archive, shift, plan.image_size, classes=source_set.classes)
        else:
            style = load_style(kits.emoji, shift, plan.image_size)
        if style.classes != source_set.classes:
            raise RuntimeError(f"{shift}: class list differs from the source style's")
        a, e = split_adapt_eval(style.labels.tolist(), plan.eval_share, plan.split_seed)
        targets[shift] = Target(shift, style, cap_indices(a, plan.max_adapt, plan.split_seed),
                                cap_indices(e, plan.max_eval, plan.split_seed))
    return source_set, targets


def build_pools(plan: BenchPlan, kits: Kits, targets: Mapping[str, Target], work: Path, device: torch.device
                ) -> tuple[dict[str, tuple[NeighbourProvider, str]], dict[str, Component]]:
    """Per shift of ``targets`` and retriever of the plan, the shift's pool (embeddings cached under
    ``work/embeddings``) and its key (R, component names, ids hash), keyed by :func:`pool_name`; and every pool
    component by name (their labels make the side table)."""
    emoji_pool = [s for s in DEFAULT_STYLES if s != SOURCE_STYLE]
    comps = pool_components(kits, emoji_pool, plan.pool_cap, archive_styles=plan.archive_styles)
    pools: dict[str, tuple[NeighbourProvider, str]] = {}
    images: dict[str, Any] = {}  # decoded pool images, shared by every pool
    for retriever in plan.retrievers:
        embedder = Embedder(EmbedderSpec(backbone=PRESETS[retriever], image_size=plan.retriever_size), device)
        store = EmbeddingStore(embedder, embedder.identity, work / "embeddings")
        for shift, tgt in targets.items():
            names = (pool_names(shift, list(POOL_SOURCES), emoji_pool, plan.archive_styles) if plan.archive_styles
                     else list(POOL_SOURCES) + [s for s in emoji_pool if s != shift])
            pool = BenchPool(embedder, [comps[n] for n in names], [store.component(comps[n]) for n in names],
                             store.queries(tgt.style, tgt.adapt_idx), images)
            ids_hash = hashlib.sha256("\n".join(pool.all_ids()).encode()).hexdigest()[:16]
            pools[pool_name(shift, retriever, plan)] = (pool, f"{store.tag}|{'+'.join(names)}|{ids_hash}")
    return pools, comps


def source_config(plan: BenchPlan, seed: int) -> TrainConfig:
    """How the source model f_S of ``seed`` is trained (the plan's source schedule)."""
    return TrainConfig(epochs=plan.source_epochs, lr=plan.source_lr, batch_size=plan.batch_size,
                       train_groups=plan.train_groups, seed=seed)


def build_context(plan: BenchPlan, work: Path, cache: Path, device: torch.device) -> Context:
    """Data kits, target splits, per-seed source models and per-shift pools (all cached under ``work``)."""
    kits = build_kits(work, cache, archive_needed(plan))
    source_set, targets = load_targets(plan, kits)
    sources = {seed: source_model(work, source_set, source_config(plan, seed), plan.image_size, kits.emoji_request,
                                  device)
               for seed in sorted(set(plan.seeds) | set(plan.select_seeds))}
    pools, comps = build_pools(plan, kits, targets, work, device)
    return Context(plan, device, work, targets, sources, pools, side_table(list(comps.values())), code_hash())


class OracleProvider:
    """A pool that never returns neighbours of the query's true class (the emoji side labels): a diagnostic arm
    that tells whether false negatives are what hurts. Never a product option."""

    def __init__(self, base: NeighbourProvider, side: Mapping[str, tuple[str, str]], query_labels: Sequence[str]
                 ) -> None:
        self.base, self.side, self.query_labels = base, side, list(query_labels)

    @property
    def identity(self) -> str:
        return self.base.identity + "|oracle-no-same-class"

    def size(self) -> int:
        return self.base.size()

    def embed(self, images: torch.Tensor) -> np.ndarray:
        return self.base.embed(images)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        scores, ids = self.base.search(queries, k)
        out = [[pid if self.side.get(pid, ("", ""))[0] != lab else "" for pid in row]
               for row, lab in zip(ids, self.query_labels, strict=True)]
        return scores, out

    def all_ids(self) -> list[str]:
        return self.base.all_ids()

    def fetch(self, ids: Sequence[str]) -> list[Any]:
        return self.base.fetch(ids)

    def sources(self, ids: Sequence[str]) -> list[str]:
        return self.base.sources(ids)

    def labels(self, ids: Sequence[str]) -> list[str | None]:
        return self.base.labels(ids)


def _curves(history: Sequence[StepStats]) -> list[dict[str, float]]:
    by_epoch: dict[int, list[StepStats]] = {}
    for h in history:
        by_epoch.setdefault(h.epoch, []).append(h)
    out = []
    for epoch, steps in sorted(by_epoch.items()):
        row: dict[str, float] = {"epoch": float(epoch)}
        for f in CURVE_FIELDS:
            vals = [float(getattr(s, f, math.nan)) for s in steps]
            vals = [v for v in vals if not math.isnan(v)]
            row[f] = statistics.mean(vals) if vals else math.nan
        out.append(row)
    return out


#: the plan fields a single run's result depends on (the rest decide *which* runs a plan makes, so plans that
#: differ only there share their cached runs)
RUN_FIELDS = ("epochs", "max_steps", "min_steps", "batch_size", "warmup_frac", "k", "image_size", "eval_share",
              "split_seed", "max_adapt", "max_eval", "source_epochs", "source_lr", "train_groups",
              "retriever_size", "pool_cap", "archive_styles", "holdout_per_class")


def arm_key(ctx: Context, arm: Mapping[str, Any]) -> str:
    """Cache key of one run: the code, the arm, its source model and data, and the run-affecting plan fields."""
    tgt = ctx.targets[arm["shift"]]
    plan = ctx.plan.as_dict()
    # the label only names the arm in a report: one run under two labels (the validated T3AR when validation kept
    # the paper's behaviour) is run once
    blob = {"code": ctx.code, "arm": {k: v for k, v in arm.items() if k != "label"},
            "source": ctx.sources[arm["seed"]].sha256,
            "retriever": arm.get("retriever") or ctx.plan.retrievers[0],
            "plan": {k: plan[k] for k in RUN_FIELDS},
            "adapt": [tgt.style.items[i] for i in tgt.adapt_idx], "eval": [tgt.style.items[i] for i in tgt.eval_idx]}
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:24]


def run_arm(ctx: Context, arm: Mapping[str, Any]) -> dict[str, Any]:
    """One paired run (cached): adapt a copy of the seed's source model on the arm's subset, evaluate."""
    path = ctx.work / "method-runs" / f"{arm_key(ctx, arm)}.json"
    if path.is_file():
        cached = json.loads(path.read_text())
        if "label" in arm:  # this arm's name (the key ignores it)
            cached["label"] = arm["label"]
        return {**cached, "cached": True}
    plan, tgt = ctx.plan, ctx.targets[arm["shift"]]
    src = ctx.sources[arm["seed"]]
    subset = adapted_subset(tgt, arm["fraction"], arm["seed"])
    x, y = tgt.style.images[subset], tgt.style.labels[subset]
    spe = steps_per_epoch(len(subset), min(plan.batch_size, len(subset)))
    # an arm may carry its own schedule (the schedule study's candidates); else the plan's
    max_steps, plan_epochs = arm.get("max_steps", plan.max_steps), arm.get("epochs", plan.epochs)
    epochs = plan_epochs if max_steps is None else max(1, min(plan_epochs, max_steps // spe))
    model = copy.deepcopy(src.model)
    seed = int(arm["seed"])
    seed_everything(seed)
    b = src.spec.backbone
    t0 = time.perf_counter()
    record: dict[str, Any] = {**arm, "n_adapt": len(subset), "n_eval": len(tgt.eval_idx), "epochs": epochs}
    options = dict(arm.get("options", {}))
    train_groups = options.pop("train_groups", plan.train_groups)
    switches = {k: options.pop(k) for k in PROBE_SWITCHES if k in options}  # out of the product: the probe's
    if arm["method"] == "supervised":
        tc = TrainConfig(epochs=epochs, lr=arm["lr"], batch_size=plan.batch_size, train_groups=train_groups,
                         warmup_frac=plan.warmup_frac, seed=seed)
        res = train_supervised(model, x, y, tc, mean=b.mean, std=b.std, device=ctx.device,
                               generator=torch.Generator().manual_seed(seed))
    else:
        schedule = {"epochs": epochs, "min_steps": plan.min_steps, "batch_size": plan.batch_size, "lr": arm["lr"],
                    "warmup_frac": plan.warmup_frac, "train_groups": train_groups}
        accepted = method_config.config_class(arm["method"]).flat_fields()  # source: none; bn-adapt: its batch
        cfg = adapt_config(**{"method": arm["method"], "mode": arm.get("mode", "test"), **plan_k(arm, plan),
                             **{k: v for k, v in schedule.items() if k in accepted}, "seed": seed, **options})
        retrieved = None
        pool_kw: dict[str, Any] = {}
        probe_kw: dict[str, Any] = {}  # the benchmark's controls (t3ar.method.probe)
        pool_ids: list[str] = []
        pool_x: torch.Tensor | None = None
        draw = arm.get("label_draw")  # a labelled arm: the pool's labels reach the method (else it sees none)
        if cfg.uses_retrieval:
            pool, pool_key = ctx.pools[pool_name(arm["shift"], arm.get("retriever"), ctx.plan)]
            provider: Any = OracleProvider(pool, ctx.side, tgt.style.label_names(subset)) if arm.get("oracle") \
                else pool
            # a ranking option that uses the model (issue 52) sees the source model with the target's statistics
            retrieved = retrieve(provider, x, cfg, src.spec.image_size, stream(seed, 4),
                                 context=RankContext.for_job(src.model, x, cfg, src.spec, ctx.device),
                                 probe=Probe(redraw_neighbours=bool(switches.get("redraw_neighbours", False))))
            record["pool"] = pool_key
            record["pool_images_fetched"] = len(retrieved.pool_ids)
            pool_ids, pool_x = list(retrieved.pool_ids), retrieved.pool_images
            n_retrieved = len(pool_ids)
            if draw in ("random", "all"):  # the controls draw from every labelled pool item: append them
                lab_ids, lab_x = labelled_tensors(pool, pool_key, ctx.side, src.spec.image_size)
                pool_ids, pool_x = pool_ids + lab_ids, torch.cat([pool_x, lab_x])
                record["pool_labelled_items"] = len(lab_ids)
            classes = {c: i for i, c in enumerate(src.spec.classes)}
            truth = torch.tensor([classes.get(ctx.side.get(pid, ("", ""))[0], -1) for pid in pool_ids],
                                 dtype=torch.long)
            if pool_as_data(cfg) or getattr(cfg.retrieval_options, "false_negatives", "keep") != "keep" or draw:
                pool_kw = {"pool_sources": [pid.split("/", 1)[0] for pid in pool_ids]}
                probe_kw = {"pool_diagnostic_labels": truth, "pool_label_oracle": bool(arm.get("oracle_pool_labels"))}
            if draw:
                known = truth.clone()
                # an appended copy of a retrieved item is never drawn (the retrieved one is): equal chances
                seen = set(pool_ids[:n_retrieved])
                for j in range(n_retrieved, len(pool_ids)):
                    if pool_ids[j] in seen:
                        known[j] = -1
                pool_kw.update(pool_labels=known)
                probe_kw.update(pool_label_draw=draw)
        curves = bool(arm.get("curves"))
        eval_curve: list[dict[str, float]] = []
        norm = Normalizer(b.mean, b.std, ctx.device)

        def on_step(st: StepStats) -> None:  # diagnostic only: held-out accuracy at each epoch's end
            if st.step % max(1, min(spe, st.total_steps)) == 0 or st.step == st.total_steps:
                rep = evaluate(model, tgt.eval_x, tgt.eval_y, src.spec.classes, norm)
                eval_curve.append({"epoch": float(st.epoch), "step": float(st.step), "top1": float(rep["top1"])})  # type: ignore[arg-type]

        res = adapt(model, x, cfg, mean=b.mean, std=b.std, labels=y if cfg.mode == "train" else None,
                    neighbours=retrieved.neighbours if retrieved else None, pool_images=pool_x,
                    candidates=getattr(retrieved, "candidates", None) if retrieved else None,
                    device=ctx.device, generator=torch.Generator().manual_seed(seed),
                    on_step=on_step if arm.get("eval_curve") else None,
                    probe=Probe(diagnostic_labels=y if curves else None, diagnostics=curves, **switches, **probe_kw),
                    **pool_kw)
        if eval_curve:
            record["eval_curve"] = eval_curve
        record["steps"] = res.steps
        record["pool_used"] = len(res.pool_used)
        if curves:
            record["curves"] = _curves(res.history)
        if pool_as_data(cfg):  # how many neighbours served as data per step, and how many had the right label
            record["pool_data"] = pool_data_summary(res.history)
        if draw and retrieved is not None:  # what the labelled items were (reporting only)
            retrieving = retrieved.candidates if retrieved.candidates is not None else retrieved.neighbours
            record["label_use"] = label_use(res.pool_labelled, pool_ids, pool_kw["pool_labels"], res.steps,
                                            retrieving if draw == "retrieved" else None, y)
    norm = Normalizer(b.mean, b.std, ctx.device)
    rep = evaluate(model, tgt.eval_x, tgt.eval_y, src.spec.classes, norm)
    record.update({"top1": rep["top1"], "mean_class_accuracy": rep["mean_class_accuracy"],
                   "seconds": time.perf_counter() - t0, "steps": res.steps})
    if arm.get("mode", "test") == "test" and arm["method"] != "supervised":
        record.update(target_measures(model, tgt, subset, seed, plan.holdout_per_class, norm))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)
    return {**record, "cached": False}


#: per process: the labelled items of a pool as tensors (ids, uint8 [L,3,S,S]), keyed by the pool's key
_LABELLED: dict[tuple[str, int], tuple[list[str], torch.Tensor]] = {}


def labelled_tensors(pool: NeighbourProvider, pool_key: str, side: Mapping[str, tuple[str, str]], size: int
                     ) -> tuple[list[str], torch.Tensor]:
    """Every labelled item of ``pool`` (its ids in ``side``) decoded once per process at ``size``."""
    key = (pool_key, size)
    if key not in _LABELLED:
        ids = [pid for pid in pool.all_ids() if pid in side]
        imgs = [to_tensor_uint8(img, size) for img in pool.fetch(ids)]
        _LABELLED[key] = (ids, torch.stack(imgs) if imgs else torch.empty(0, 3, size, size, dtype=torch.uint8))
    return _LABELLED[key]


def source_record(ctx: Context, shift: str, seed: int, fraction: float | None = None) -> dict[str, Any]:
    """The source model of ``seed`` on ``shift``'s evaluation part; with a ``fraction``, also its
    :func:`target_measures` on that cell's adapted subset and holdouts (the source is an acceptance candidate)."""
    tgt, src = ctx.targets[shift], ctx.sources[seed]
    b = src.spec.backbone
    norm = Normalizer(b.mean, b.std, ctx.device)
    rep = evaluate(src.model, tgt.eval_x, tgt.eval_y, src.spec.classes, norm)
    out = {"top1": rep["top1"], "mean_class_accuracy": rep["mean_class_accuracy"]}
    if fraction is not None:
        out.update(target_measures(src.model, tgt, adapted_subset(tgt, fraction, seed), seed,
                                   ctx.plan.holdout_per_class, norm))
    return out


def adapted_subset(tgt: Target, fraction: float, seed: int) -> list[int]:
    """The style indices a run of (``fraction``, ``seed``) adapts on: the seeded nested subset of the adaptation
    part (:func:`fraction_subset`)."""
    return [tgt.adapt_idx[i] for i in fraction_subset(len(tgt.adapt_idx), fraction, seed)]


@torch.no_grad()
def _outputs(model: torch.nn.Module, images: torch.Tensor, norm: Normalizer, batch_size: int = 256
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(features, logits) of uint8 ``images`` in eval mode (features: the classifier's bottleneck)."""
    was = model.training
    model.eval()
    feats, logits = [], []
    for i in range(0, len(images), batch_size):
        f, z = model.forward_all(norm(images[i:i + batch_size]))  # type: ignore[operator]
        feats.append(f.float().cpu())
        logits.append(z.float().cpu())
    model.train(was)
    return torch.cat(feats), torch.cat(logits)


def target_measures(model: torch.nn.Module, tgt: Target, subset: Sequence[int], seed: int,
                    holdout_per_class: Sequence[int], norm: Normalizer) -> dict[str, Any]:
    """What an adapted model shows without the evaluation part's labels: on its target (the adapted ``subset``, no
    labels) the label-free criteria (:mod:`t3ar.method.selection`; SND on the softmax outputs and on the bottleneck
    features) and its predictions (agreement with bn-adapt's is computed by the report); on each acceptance holdout
    (:func:`holdout_indices`: labelled images of the adaptation part outside ``subset``) its top-1 and size."""
    feats, logits = _outputs(model, tgt.style.images[list(subset)], norm)
    crit = criteria(logits)
    crit["snd_features"] = soft_neighbourhood_density(feats) if len(feats) >= 2 else math.nan
    out: dict[str, Any] = {"criteria": crit, "target_predictions": logits.argmax(1).tolist()}
    if holdout_per_class:
        labels = tgt.style.labels.tolist()
        widest = holdout_indices(tgt.adapt_idx, subset, labels, max(holdout_per_class), seed)
        right = {}
        if widest:
            pred = _outputs(model, tgt.style.images[widest], norm)[1].argmax(1)
            right = {i: bool(p == labels[i]) for i, p in zip(widest, pred.tolist(), strict=True)}
        hold = {}
        for k in holdout_per_class:
            idx = holdout_indices(tgt.adapt_idx, subset, labels, k, seed)  # nested: a part of ``widest``
            hold[str(k)] = {"top1": sum(right[i] for i in idx) / len(idx) if idx else math.nan, "n": len(idx),
                            "correct": [right[i] for i in idx]}  # per image: the paired winner rule reads them
        out["holdout"] = hold
    return out


_WORKER: dict[str, Context] = {}


def _init_worker(plan: BenchPlan, work: Path, cache: Path, device: str) -> None:
    torch.set_num_threads(1)
    _WORKER["ctx"] = build_context(plan, work, cache, torch.device(device))


def _run_in_worker(arm: Mapping[str, Any]) -> dict[str, Any]:
    return run_arm(_WORKER["ctx"], arm)


def progress_log(total: int, every: int = 10) -> Callable[[Mapping[str, Any]], None]:
    """A ``run_all`` progress callback that logs every ``every`` runs and the last: done, elapsed, an estimate of
    what is left."""
    done, start = [0], time.perf_counter()

    def progress(rec: Mapping[str, Any]) -> None:
        done[0] += 1
        if done[0] % every == 0 or done[0] == total:
            el = time.perf_counter() - start
            log.info("[%d/%d] runs, %.0f s elapsed, ~%.0f s left", done[0], total, el,
                     el / done[0] * (total - done[0]))

    return progress


def run_all(ctx: Context, arms: Sequence[Mapping[str, Any]], cache: Path,
            progress: Callable[[Mapping[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Every arm, in order (in ``plan.workers`` processes when > 1; cached arms are read in-process)."""
    out: list[dict[str, Any] | None] = [None] * len(arms)
    todo = []
    for i, arm in enumerate(arms):
        path = ctx.work / "method-runs" / f"{arm_key(ctx, arm)}.json"
        if path.is_file() or ctx.plan.workers <= 1:
            out[i] = run_arm(ctx, arm)
            if progress:
                progress(out[i] or {})
        else:
            todo.append(i)
    if todo and len(todo) <= ctx.plan.workers:  # a few runs: in this process (a pool's start builds the context)
        for i in todo:
            out[i] = run_arm(ctx, arms[i])
            if progress:
                progress(out[i] or {})
        todo = []
    if todo:
        import multiprocessing as mp

        with ProcessPoolExecutor(ctx.plan.workers, mp_context=mp.get_context("spawn"), initializer=_init_worker,
                                 initargs=(ctx.plan, ctx.work, cache, str(ctx.device))) as pool:
            for i, rec in zip(todo, pool.map(_run_in_worker, [arms[i] for i in todo]), strict=True):
                out[i] = rec
                if progress:
                    progress(rec)
    return [r for r in out if r is not None]


def plan_k(arm: Mapping[str, Any], plan: BenchPlan) -> dict[str, Any]:
    """The arm's k (or the plan's) for a method whose config has one."""
    return {"k": arm.get("k", plan.k)} if "k" in method_config.config_class(arm["method"]).flat_fields() else {}


def pool_as_data(cfg: AdaptConfig) -> bool:
    """Retrieved neighbours serve as data (a T3AR-family option)."""
    return cfg.pool_use().as_data

"""The adaptation loop: T3AR and its baselines on in-memory tensors. No I/O.

Inputs are uint8 image tensors already at the model's input size, the (optional) retrieved neighbours
as local pool indices ``[N_T, k]`` and the pool images they index. Target and pool images are copied to
the device once per job when they fit; views are computed there a batch at a time
(:mod:`t3ar.method.views`). Each method lives in its own module behind :class:`~t3ar.method.base.MethodStep`
(its name and properties: :mod:`t3ar.method.registry`), with what it does beside its steps in its stages
(:class:`~t3ar.method.base.Stage`: hooks before, during and after the steps) and its per-step record
(:attr:`~t3ar.method.base.MethodStep.stats`); this loop owns the optimiser, schedule, AMP, timing, the
statistics and their one device sync per step, and knows no method by name. Progress goes to a callback, which
may raise to cancel the run. Each step's views (:meth:`~t3ar.method.base.MethodStep.prepare`) are made one step
ahead on a background thread where ``config.views_ahead`` says so (:mod:`t3ar.method.ahead`; the CPU and CUDA by
default): the same results either way.

Random streams are separate (so the arms of a comparison share all but what differs): batch order from
``generator`` (or ``config.seed``); target views, pool views, bank initialisation and (the probe's
``redraw_neighbours``) the per-visit neighbour draws each from their own generator derived from
``config.seed`` (:func:`~t3ar.method.base.stream`, which lists them).

The benchmarks' controls and measurements reach the loop through one argument, ``probe``
(:class:`~t3ar.method.probe.Probe`), which the product never sets. Its measurements never touch a loss:
``diagnostic_labels`` only score the pseudo-labels each step used (``StepStats.pl_accuracy``); ``diagnostics``
adds the T3AR family's per-term gradient norms.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

import torch
from torch import nn

from t3ar.cpu_memory import retain_freed_memory
from t3ar.method.ahead import Ahead
from t3ar.method.ahead import enabled as ahead_enabled
from t3ar.method.augment import Normalizer
from t3ar.method.base import MethodSetup, MethodStep, Run, Stage, stream
from t3ar.method.bn_adapt import bn_adapt
from t3ar.method.config import AdaptConfig, OptimiserConfig, StatisticsConfig, statistics, trained
from t3ar.method.probe import NO_PROBE, Probe
from t3ar.method.record import AdaptResult, StepStats
from t3ar.method.schedule import Optimiser, scheduled, steps_per_epoch
from t3ar.method.views import CHANNELS_LAST, Views
from t3ar.models.classifier import Classifier, freeze_frozen_norms
from t3ar.models.fold import FOLD, folded_frozen_norms

__all__ = ["AdaptResult", "StepStats", "adapt", "fast_layout", "folded_layers", "place", "prepare_training",
           "scheduled", "stream"]

log = logging.getLogger(__name__)

# Target and pool images are kept on the GPU when together they need at most this share of its free memory.
DEVICE_DATA_SHARE = 0.25


def place(images: torch.Tensor, device: torch.device, budget: float) -> torch.Tensor:
    """``images`` on ``device`` when they fit in ``budget`` bytes (CUDA), else in page-locked host memory."""
    if device.type != "cuda":
        return images
    if images.numel() * images.element_size() <= budget:
        return images.to(device)
    return images.pin_memory()


def _device_budget(device: torch.device) -> float:
    if device.type != "cuda":
        return 0.0
    free, _ = torch.cuda.mem_get_info(device)
    return free * DEVICE_DATA_SHARE


def fast_layout(model: nn.Module, device: torch.device) -> None:
    """Channels-last weights where that is the fast layout (the CPU's oneDNN; see ``views.CHANNELS_LAST``)."""
    if CHANNELS_LAST.get(device.type, False):
        model.to(memory_format=torch.channels_last)


def prepare_training(model: nn.Module, device: torch.device) -> None:
    """What every training loop does first on ``device``: the fast weight layout and, on the CPU, freed memory
    kept for reuse (:mod:`t3ar.cpu_memory`)."""
    if device.type == "cpu":
        retain_freed_memory()
    fast_layout(model, device)


def folded_layers(model: Classifier, device: torch.device) -> AbstractContextManager[int]:
    """Every training loop's block: the model's frozen convolution + BatchNorm pairs folded into one
    convolution where :data:`t3ar.models.fold.FOLD` says so for ``device`` (:mod:`t3ar.models.fold`)."""
    return folded_frozen_norms(model.backbone, FOLD.get(device.type, False))


def adapt(model: Classifier, target: torch.Tensor, config: AdaptConfig, *, mean: tuple[float, float, float],
          std: tuple[float, float, float], labels: torch.Tensor | None = None,
          neighbours: torch.Tensor | None = None, pool_images: torch.Tensor | None = None,
          device: torch.device | None = None, generator: torch.Generator | None = None,
          on_step: Callable[[StepStats], None] | None = None, candidates: torch.Tensor | None = None,
          pool_sources: Sequence[str] | None = None, pool_labels: torch.Tensor | None = None,
          probe: Probe | None = None) -> AdaptResult:
    """Adapt ``model`` in place on ``target`` (uint8 [N,3,S,S]) with ``config.method``; the job's inputs as
    :func:`method_setup` checks them (``labels`` in train mode; a retrieval method's pool). ``generator`` draws the
    batch order (default: seeded from ``config.seed``); ``on_step`` gets each step's record (the method's
    :attr:`~t3ar.method.base.MethodStep.stats`). Returns timings, the history of steps and the pool indices used."""
    device = device or next(model.parameters()).device
    gen = generator or torch.Generator().manual_seed(config.seed)
    if config.spec.bn_statistics:  # no optimiser: the target's BatchNorm statistics (bn-adapt)
        return _bn_adapt(model, target, statistics(config), Normalizer(mean, std, device), gen, on_step)
    method: type[MethodStep] | None = config.spec.step_class()
    if method is None:  # source: the model as it is
        return AdaptResult()
    config = trained(config)
    stages = method.stages(config)
    views = Views(Normalizer(mean, std, device), stream(config.seed, 1), stream(config.seed, 5))
    setup = method_setup(target, config, views, device, stages, labels=labels, neighbours=neighbours,
                         pool_images=pool_images, candidates=candidates, pool_sources=pool_sources,
                         pool_labels=pool_labels, probe=probe or NO_PROBE)
    n, target, probe = len(setup.target), setup.target, setup.probe
    diag = probe.diagnostic_labels.to(device) if probe.diagnostic_labels is not None else None
    use_amp = device.type == "cuda" and config.amp
    run = Run(model, setup, gen, use_amp, AdaptResult())
    prepare_training(model, device)
    for stage in stages:
        stage.before(run)
    params = method.trainable_params(model, config)
    batch_size = min(config.batch_size, n)
    spe = steps_per_epoch(n, batch_size)
    total = max(config.epochs * spe, config.min_steps)
    optim = Optimiser(params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay,
                      total_steps=total, warmup_frac=config.warmup_frac, amp=use_amp)
    with torch.autocast(device.type, enabled=use_amp):
        state = run.method = method.create(model, setup)
    for stage in stages:
        stage.start(run)

    def prepare(item: tuple[int, torch.Tensor]) -> object:  # the views of a batch: no model (method.ahead)
        with torch.autocast(device.type, enabled=use_amp):  # autocast is per thread: the same on every thread
            return state.prepare(target[item[1].to(target.device)], item[1])

    t_start = mark = time.perf_counter()  # mark: where the current step began (the previous one's report)
    step = epoch = 0
    with folded_layers(model, device), \
            Ahead(scheduled(n, batch_size, total, gen), prepare, on=ahead_enabled(config.views_ahead, device)) as ahead:
        for (epoch, idx), prepared, seconds_views in ahead:
            model.train()
            freeze_frozen_norms(model)
            lr = optim.lr
            with torch.autocast(device.type, enabled=use_amp):
                out = state.step(model, idx.to(target.device), idx, prepared)
            parts = dict(out.parts)
            for stage in stages:
                parts.update(stage.step_parts(run))
            if diag is not None:  # reporting only: compared after the fact, never part of a loss
                parts["pl_accuracy"] = (out.pseudo_labels.to(device) == diag[idx.to(device)]).float().mean()
            optim.update(out.loss)
            step += 1
            values = _read({"loss": out.loss, **parts})  # the step's one device sync
            if state.after_update():  # the method reset its weights (SAR): the optimiser's momentum goes too
                optim.reset_state()
            ahead.settle()  # the next batch's views, made during this step, are part of it (never of on_step)
            stats = method.stats(epoch, step, total, lr, seconds_augment=seconds_views,
                                 seconds_forward_backward=time.perf_counter() - mark - ahead.waited, **values)
            run.result.history.append(stats)
            if on_step is not None:
                on_step(stats)
            if any([stage.stop(run, stats) for stage in stages]):
                run.stopped = True
                break
            mark = time.perf_counter()
        for stage in stages:
            stage.after_steps(run)
    for stage in stages:
        stage.after(run)
    model.eval()
    result = run.result
    result.steps, result.epochs = step, epoch
    result.seconds = time.perf_counter() - t_start
    result.seconds_per_epoch = result.seconds * spe / max(1, step)
    result.pool_used, result.pool_labelled = state.pool_used(), state.pool_labelled()
    return result


def _read(parts: dict[str, torch.Tensor]) -> dict[str, float]:
    """The step's scalars as floats, in one device sync."""
    names = list(parts)
    loss = parts["loss"]
    values = torch.stack([v.detach().float().to(loss.device) for v in parts.values()])
    return dict(zip(names, values.tolist(), strict=True))


def method_setup(target: torch.Tensor, config: OptimiserConfig, views: Views, device: torch.device,
                 stages: Sequence[Stage] = (), *,
                 labels: torch.Tensor | None, neighbours: torch.Tensor | None, pool_images: torch.Tensor | None,
                 candidates: torch.Tensor | None, pool_sources: Sequence[str] | None,
                 pool_labels: torch.Tensor | None, probe: Probe) -> MethodSetup:
    """The job's inputs checked (ValueError naming what does not fit) and placed: target and pool images on the
    device where they fit (:data:`DEVICE_DATA_SHARE`), neighbour indices on the CPU.

    ``labels`` are required in train mode. Retrieval methods need ``pool_images`` and either ``neighbours``
    ([N, k] indices into ``pool_images``, -1 = missing: fixed for the job) or, with the probe's
    ``redraw_neighbours`` (a benchmark switch), ``candidates`` ([N, m >= k] indices, -1 = missing): every visit of a
    batch then draws k of each row's valid candidates anew (``dedup_sample``, generator ``stream(seed, 3)``) and
    ``neighbours`` is ignored. ``pool_sources`` ([P] the source of each pool image) and ``pool_labels`` ([P] the
    pool label of each pool image as an index into the model's classes, -1 = none: a product input) are what the
    pool tells beside its images; the method's ``stages`` check what they need of them and derive what the method reads
    (:meth:`~t3ar.method.base.Stage.setup`, in order, before anything is placed on the device).
    ``probe``: the benchmarks' research hook (:class:`~t3ar.method.probe.Probe`); the product never sets it."""
    if config.mode == "train" and labels is None:
        raise ValueError("train-time mode needs labels")
    retrieval = config.retrieval_options
    k = retrieval.k if retrieval is not None else 0
    redraw = retrieval is not None and probe.redraw_neighbours
    if redraw and candidates is None:
        raise ValueError(f"{config.method} with redraw_neighbours=True needs candidates ([N, r*k] pool indices, "
                         "e.g. Retrieved.candidates)")
    if config.uses_retrieval and ((neighbours is None and not redraw) or pool_images is None):
        raise ValueError(f"{config.method} needs neighbours and pool images")
    n = len(target)
    if n < 2:
        raise ValueError("need at least 2 target images")
    if redraw and candidates is not None and (candidates.dim() != 2 or len(candidates) != n
                                              or candidates.shape[1] < k):
        raise ValueError(f"candidates must be [N={n}, m >= k={k}], got {list(candidates.shape)}")
    n_pool = len(pool_images) if (config.uses_retrieval and pool_images is not None) else 0
    if pool_sources is not None and len(pool_sources) != n_pool:
        raise ValueError(f"pool_sources must name the source of each of the {n_pool} pool images")
    if pool_labels is not None and pool_labels.shape != (n_pool,):
        raise ValueError(f"pool_labels must be [P={n_pool}], got {list(pool_labels.shape)}")
    probe.check(n, n_pool)
    setup = MethodSetup(target, config, views, device, labels=labels,
                        pool_images=pool_images if config.uses_retrieval else None,
                        neighbours=neighbours.cpu() if (config.uses_retrieval and neighbours is not None
                                                        and not redraw) else None,
                        candidates=candidates.cpu() if (redraw and candidates is not None) else None,
                        pool_sources=pool_sources if config.uses_retrieval else None,
                        pool_known=pool_labels if config.uses_retrieval else None, probe=probe)
    for stage in stages:
        setup = stage.setup(setup)
    budget = _device_budget(device)
    target = place(target, device, budget)
    pool = setup.pool_images
    if pool is not None:
        pool = place(pool, device, budget - target.numel() * (target.device == device))
    return dataclasses.replace(setup, target=target, pool_images=pool)


def _bn_adapt(model: Classifier, target: torch.Tensor, config: StatisticsConfig, norm: Normalizer, gen: torch.Generator,
              on_step: Callable[[StepStats], None] | None) -> AdaptResult:
    """``bn-adapt`` (:mod:`t3ar.method.bn_adapt`) with the loop's result and progress: one pass, each batch
    reported as a step (no loss)."""
    t0 = time.perf_counter()
    result = AdaptResult()

    def on_batch(done: int, total: int) -> None:
        stats = StepStats(1, done, total, 0.0, 0.0)
        result.history.append(stats)
        if on_step is not None:
            on_step(stats)

    target = place(target, norm.device, _device_budget(norm.device))
    result.steps = bn_adapt(model, target, train_groups=config.train_groups, batch_size=config.batch_size,
                            norm=norm, generator=gen, on_batch=on_batch)
    result.epochs = 1
    result.seconds = result.seconds_per_epoch = time.perf_counter() - t0
    return result

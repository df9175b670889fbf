"""The adaptation loop: T3AR and its baselines on in-memory tensors. No I/O.

Inputs are uint8 image tensors already at the model's input size, the (optional) retrieved neighbours
as local pool indices ``[N_T, k]`` and the pool images they index. Target and pool images are copied to
the device once per job when they fit; views are computed there a batch at a time
(:mod:`t3ar.method.views`). Each method lives in its own module behind :class:`~t3ar.method.base.MethodStep`
(its name and properties: :mod:`t3ar.method.registry`); this loop owns the optimiser, schedule, AMP, timing,
the statistics and their one device sync per step. Progress goes to a callback, which may raise to cancel the
run. Each step's views (:meth:`~t3ar.method.base.MethodStep.prepare`) are made one step ahead on a background
thread where ``config.views_ahead`` says so (:mod:`t3ar.method.ahead`; the CPU and CUDA by default): the same
results either way.

Random streams are separate (so the arms of a comparison share all but what differs): batch order from
``generator`` (or ``config.seed``); target views, pool views, bank initialisation and
(``config.redraw_neighbours``) the per-visit neighbour draws each from their own generator derived from
``config.seed`` (:func:`~t3ar.method.base.stream`, which lists them).

The benchmarks' controls and measurements reach the loop through one argument, ``probe``
(:class:`~t3ar.method.probe.Probe`), which the product never sets. Its measurements never touch a loss:
``diagnostic_labels`` only score the pseudo-labels each step used (``StepStats.pl_accuracy``); ``diagnostics``
adds the T3AR family's per-term gradient norms.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from t3ar.cpu_memory import retain_freed_memory
from t3ar.method.ahead import Ahead
from t3ar.method.ahead import enabled as ahead_enabled
from t3ar.method.augment import Normalizer
from t3ar.method.base import MethodSetup, stream
from t3ar.method.bn_adapt import bn_adapt
from t3ar.method.config import AdaptConfig
from t3ar.method.probe import NO_PROBE, Probe
from t3ar.method.safeguards import CollapseWatch, bn_adapt_state, class_entropy, interpolate
from t3ar.method.schedule import Optimiser, epoch_batches, steps_per_epoch
from t3ar.method.specs.family import T3ARConfig
from t3ar.method.views import CHANNELS_LAST, Views
from t3ar.models.classifier import Classifier, eval_norms, freeze_frozen_norms
from t3ar.models.fold import FOLD, folded_frozen_norms

log = logging.getLogger(__name__)

# Target and pool images are kept on the GPU when together they need at most this share of its free memory.
DEVICE_DATA_SHARE = 0.25


@dataclass
class StepStats:
    """One optimiser step, reported to ``on_step``. NaN = not measured for this method/run.

    ``pl_accuracy``: accuracy of the labels the step trained on against ``Probe.diagnostic_labels``
    (T3AR family: the filtered pseudo-labels, or the true labels in train mode; AdaContrast: its refined
    pseudo-labels; tent / SHOT-IM: the argmax of the logits their loss is computed on, i.e. the plain view for
    tent and the weak view for SHOT-IM). ``pool_neg_share`` (T3AR family, always): the batch-mean share of the
    InfoNCE denominator (positive + negatives, Σ exp(logit)) from pool negatives; 0.0 without any.
    ``seconds_augment``: the wall time the step's views took to make (on the background thread when made ahead,
    overlapping the step before); ``seconds_forward_backward``: the rest of the step's wall time.
    ``grad_norm_ce`` / ``grad_norm_contrastive`` (T3AR family with ``Probe.diagnostics``): L2 norm of the
    gradient of each weighted term at the query features (a proxy, not the parameter gradient).
    ``pool_data_count`` (T3AR with neighbours as data): how many retrieved neighbours served as data in the step;
    with ``Probe.pool_diagnostic_labels`` also ``pool_data_known``, how many of those have a known label, and
    ``pool_data_correct``, the share of the known ones whose pseudo-label was right (NaN when none was known).
    ``pool_label_count`` / ``loss_pool_labels`` (labelled neighbours as data): how many labelled pool items
    trained the step, and their cross-entropy (NaN when none did). ``reliable_share`` (``reliable_entropy``): the
    share of the batch the cross-entropy counted; ``loss_anchor`` (``anchor``): the weighted penalty towards the
    start weights; ``pl_class_entropy`` (``collapse_fallback``): the entropy of the class histogram of the job's
    pseudo-labels after the step, the signal the collapse watch reads (:mod:`t3ar.method.safeguards`).
    """

    epoch: int
    step: int
    total_steps: int
    lr: float
    loss: float
    loss_ce: float = 0.0
    loss_contrastive: float = 0.0
    pl_change_rate: float = 0.0
    loss_diversity: float = 0.0
    seconds_augment: float = 0.0
    seconds_forward_backward: float = 0.0
    pl_accuracy: float = math.nan
    pool_neg_share: float = math.nan
    grad_norm_ce: float = math.nan
    grad_norm_contrastive: float = math.nan
    pool_data_count: float = math.nan
    pool_data_known: float = math.nan
    pool_data_correct: float = math.nan
    pool_label_count: float = math.nan
    loss_pool_labels: float = math.nan
    reliable_share: float = math.nan
    loss_anchor: float = math.nan
    pl_class_entropy: float = math.nan

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


@dataclass
class AdaptResult:
    steps: int = 0
    epochs: int = 0
    seconds: float = 0.0
    seconds_per_epoch: float = 0.0
    pool_used: list[int] = field(default_factory=list)
    history: list[StepStats] = field(default_factory=list)
    #: pool index -> how many steps it served as labelled data (labelled neighbours as data)
    pool_labelled: dict[int, int] = field(default_factory=dict)
    #: steps of the second stage (bottleneck and head on the target alone), after ``steps``
    second_stage_steps: int = 0
    #: the step after which the collapse watch fired (``collapse_fallback``): the model was reset to the bn-adapt
    #: state and the run ended there; None = it did not fire (or was not watching)
    collapse_step: int | None = None


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


def scheduled(n: int, batch_size: int, total: int, gen: torch.Generator) -> Iterator[tuple[int, torch.Tensor]]:
    """(epoch, batch indices) of ``total`` steps: seeded epochs of ``n`` images (``epoch_batches``), the last
    one cut short."""
    step = epoch = 0
    while step < total:
        epoch += 1
        for idx in epoch_batches(n, batch_size, gen):
            if step >= total:
                return
            yield epoch, idx
            step += 1


def adapt(
    model: Classifier,
    target: torch.Tensor,
    config: AdaptConfig,
    *,
    mean: tuple[float, float, float],
    std: tuple[float, float, float],
    labels: torch.Tensor | None = None,
    neighbours: torch.Tensor | None = None,
    pool_images: torch.Tensor | None = None,
    device: torch.device | None = None,
    generator: torch.Generator | None = None,
    on_step: Callable[[StepStats], None] | None = None,
    candidates: torch.Tensor | None = None,
    pool_sources: list[str] | None = None,
    pool_labels: torch.Tensor | None = None,
    probe: Probe | None = None,
) -> AdaptResult:
    """Adapt ``model`` in place on ``target`` (uint8 [N,3,S,S]) with ``config.method``.

    ``labels`` are required in train mode. Retrieval methods need ``pool_images`` and either ``neighbours``
    ([N, k] indices into ``pool_images``, -1 = missing: fixed for the job) or, with
    ``config.redraw_neighbours``, ``candidates`` ([N, m >= k] indices, -1 = missing): every visit of a batch
    then draws k of each row's valid candidates anew (``dedup_sample``, generator ``stream(seed, 3)``) and
    ``neighbours`` is ignored. ``generator`` draws the batch order (default: seeded from ``config.seed``).
    ``pool_sources`` ([P] the source of each pool image) lets ``config.pool_data_sources`` restrict which
    neighbours may serve as data (required when that is set).
    ``pool_labels`` ([P] the pool label of each pool image as an index into the model's classes, -1 = none) is
    what a labelled pool tells (a product input): with ``config.pool_label_weight`` > 0 the labelled neighbours
    train with their label, and with ``config.false_negatives`` other than 'keep' a labelled neighbour of the
    query's (pseudo-)class is a false negative by its label.
    ``probe``: the benchmarks' research hook (:class:`~t3ar.method.probe.Probe`: diagnostic labels, gradient
    norms, the oracle pool labels, the label draw controls); the product never sets it.
    Returns timings, the history of steps and the pool indices actually used (drawn).
    """
    probe = probe or NO_PROBE
    device = device or next(model.parameters()).device
    gen = generator or torch.Generator().manual_seed(config.seed)
    result = AdaptResult()
    spec = config.spec
    if spec.bn_statistics:  # no optimiser: the target's BatchNorm statistics (bn-adapt)
        return _bn_adapt(model, target, config, mean, std, device, gen, on_step)
    method = spec.step_class()
    if method is None:  # source: the model as it is
        return result
    if config.mode == "train" and labels is None:
        raise ValueError("train-time mode needs labels")
    # the T3AR family's groups the loop runs (BatchNorm, safeguards, second stage, pool data); None = other methods
    fam = config if isinstance(config, T3ARConfig) else None
    retrieval = config.retrieval_options
    k = retrieval.k if retrieval is not None else 0
    redraw = retrieval is not None and retrieval.redraw_neighbours
    sources = fam.pool_data.sources if (fam is not None and fam.pool_as_data) else None
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
    if sources is not None and pool_sources is None:
        raise ValueError("pool_data_sources needs the pool images' sources (pool_sources)")
    if pool_labels is not None and pool_labels.shape != (n_pool,):
        raise ValueError(f"pool_labels must be [P={n_pool}], got {list(pool_labels.shape)}")
    probe.check(n, n_pool, fam is not None and fam.pool_labels_as_data and pool_labels is not None)
    allowed = None
    if sources is not None and pool_sources is not None:
        keep = set(sources)
        allowed = torch.tensor([s in keep for s in pool_sources], dtype=torch.bool)
    budget = _device_budget(device)
    target = place(target, device, budget)
    if config.uses_retrieval and pool_images is not None:
        pool_images = place(pool_images, device, budget - target.numel() * (target.device == device))
    nbrs = neighbours.cpu() if (config.uses_retrieval and neighbours is not None and not redraw) else None
    cands = candidates.cpu() if (redraw and candidates is not None) else None
    diag = probe.diagnostic_labels.to(device) if probe.diagnostic_labels is not None else None

    prepare_training(model, device)
    bn_start = fam is not None and fam.batchnorm.start
    wise_alpha = fam.safeguards.wise_alpha if fam is not None else None
    collapse_fallback = fam.safeguards.collapse_fallback if fam is not None else None
    if bn_start:  # the target's BatchNorm statistics first (bn-adapt), from a stream of its own
        bn_adapt(model, target, train_groups=config.train_groups, batch_size=config.batch_size,
                 norm=Normalizer(mean, std, device), generator=stream(config.seed, 9))
    # the start the safeguards return to (t3ar.method.safeguards): its parameters (WiSE-FT) and the bn-adapt state
    # (the collapse fallback; the same statistics bn_start sets)
    wise_start = ({k: p.detach().clone() for k, p in model.named_parameters()} if wise_alpha is not None
                  else None)
    fallback = bn_adapt_state(model, target, done=bn_start, train_groups=config.train_groups,
                              batch_size=config.batch_size, norm=Normalizer(mean, std, device),
                              generator=stream(config.seed, 9)) if collapse_fallback is not None else None
    params = method.trainable_params(model, config)
    batch_size = min(config.batch_size, n)
    spe = steps_per_epoch(n, batch_size)
    total = max(config.epochs * spe, config.min_steps)
    use_amp = device.type == "cuda" and config.amp
    optim = Optimiser(params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay,
                      total_steps=total, warmup_frac=config.warmup_frac, amp=use_amp)
    views = Views(Normalizer(mean, std, device), stream(config.seed, 1), stream(config.seed, 5))
    setup = MethodSetup(target, config, views, device, labels=labels,
                        pool_images=pool_images if config.uses_retrieval else None, neighbours=nbrs,
                        candidates=cands, pool_allowed=allowed,
                        pool_known=pool_labels if config.uses_retrieval else None, probe=probe)
    with torch.autocast(device.type, enabled=use_amp):
        state = method.create(model, setup)
    watch = None
    if collapse_fallback is not None:
        start_labels = state.final_labels()
        if start_labels is None:
            raise ValueError(f"{config.method} keeps no pseudo-labels: collapse_fallback cannot watch them")
        watch = CollapseWatch(float(class_entropy(start_labels, model.num_classes)), collapse_fallback)
    collapsed = False

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
            if fam is not None and fam.batchnorm.fixed:
                eval_norms(model)
            ids = idx.to(target.device)
            stats = StepStats(epoch, step + 1, total, optim.lr, 0.0)
            with torch.autocast(device.type, enabled=use_amp):
                out = state.step(model, ids, idx, prepared)
            loss, parts = out.loss, dict(out.parts)
            if watch is not None:  # the signal, read in the step's one device sync
                labels_now = state.final_labels()
                assert labels_now is not None
                parts["pl_class_entropy"] = class_entropy(labels_now, model.num_classes)
            if diag is not None:  # reporting only: compared after the fact, never part of a loss
                parts["pl_accuracy"] = (out.pseudo_labels.to(device) == diag[idx.to(device)]).float().mean()
            optim.update(loss)
            step += 1
            names = ["loss", *parts]
            values = torch.stack([loss.detach().float(), *(v.float().to(loss.device) for v in parts.values())])
            for name, value in zip(names, values.tolist(), strict=True):  # one device sync per step
                setattr(stats, name, value)
            if state.after_update():  # the method reset its weights (SAR): the optimiser's momentum goes too
                optim.reset_state()
            ahead.settle()  # the next batch's views, made during this step, are part of it (never of on_step)
            # views: the wall time this batch's views took to make (ahead, on the background thread, or inline);
            # forward_backward: the rest of the step's wall time (forwards, bank, loss, backward, optimiser, the
            # one device sync, and any wait for views: the next batch's still being made, or this one's)
            stats.seconds_augment = seconds_views
            stats.seconds_forward_backward = time.perf_counter() - mark - ahead.waited
            result.history.append(stats)
            if on_step is not None:
                on_step(stats)
            if watch is not None and watch.fired(stats.pl_class_entropy):
                collapsed = True
                break
            mark = time.perf_counter()
        final = state.final_labels() if (fam is not None and fam.second_stage.steps and not collapsed) else None
        if fam is not None and final is not None:
            result.second_stage_steps = second_stage(model, target, final, fam, views, gen, use_amp)
    if collapsed and fallback is not None:  # the run is over: the bn-adapt state is the job's answer
        model.load_state_dict(fallback)
        result.collapse_step = step
        log.warning("collapse: the pseudo-labels' class entropy fell to %.3f (start %.3f) at step %d of %d; the "
                    "model is back to the bn-adapt state", result.history[-1].pl_class_entropy,
                    watch.reference if watch else math.nan, step, total)
    elif wise_start is not None and wise_alpha is not None:  # WiSE-FT, then the statistics for its weights
        interpolate(model, wise_start, wise_alpha)
        bn_adapt(model, target, train_groups=config.train_groups, batch_size=config.batch_size,
                 norm=Normalizer(mean, std, device), generator=stream(config.seed, 11))
    model.eval()
    result.steps, result.epochs = step, epoch
    result.seconds = time.perf_counter() - t_start
    result.seconds_per_epoch = result.seconds * spe / max(1, step)
    result.pool_used = state.pool_used()
    result.pool_labelled = state.pool_labelled()
    return result


def second_stage(model: Classifier, target: torch.Tensor, labels: torch.Tensor, config: T3ARConfig,
                 views: Views, gen: torch.Generator, amp: bool) -> int:
    """SWAT's second stage: ``config.second_stage.steps`` steps that retrain only the bottleneck and head on the
    target alone, with cross-entropy of weak views against ``labels`` ([N]; -1 = none: such images sit out);
    the backbone frozen and every BatchNorm layer normalising with its running statistics (the target's, as the
    first stage left them). Returns the steps taken (0 when fewer than 2 images have a label)."""
    ok = (labels.cpu() >= 0).nonzero().flatten()
    if len(ok) < 2:
        return 0
    for p in model.parameters():
        p.requires_grad_(False)
    params = [p for m in (model.bottleneck, model.head) for p in m.parameters()]
    for p in params:
        p.requires_grad_(True)
    steps = config.second_stage.steps
    optim = Optimiser(params, lr=config.second_stage.lr or config.lr, momentum=config.momentum,
                      weight_decay=config.weight_decay, total_steps=steps, warmup_frac=0.0, amp=amp)
    y_all = labels.to(target.device)
    device = next(model.parameters()).device
    model.train()
    eval_norms(model)
    done = 0
    for _, pos in scheduled(len(ok), min(config.batch_size, len(ok)), steps, gen):
        idx = ok[pos].to(target.device)
        with torch.autocast(device.type, enabled=amp):
            x = views.weak(target[idx].to(device, non_blocking=True))
            with torch.no_grad():
                h = model.backbone(x)
            logits = model.head(model.bottleneck(h))
            loss = torch.nn.functional.cross_entropy(logits.float(), y_all[idx].to(device))
        optim.update(loss)
        done += 1
    return done


def _bn_adapt(model: Classifier, target: torch.Tensor, config: AdaptConfig, mean: tuple[float, float, float],
              std: tuple[float, float, float], device: torch.device, gen: torch.Generator,
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

    target = place(target, device, _device_budget(device))
    result.steps = bn_adapt(model, target, train_groups=config.train_groups, batch_size=config.batch_size,
                            norm=Normalizer(mean, std, device), generator=gen, on_batch=on_batch)
    result.epochs = 1
    result.seconds = result.seconds_per_epoch = time.perf_counter() - t0
    return result

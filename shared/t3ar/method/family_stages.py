"""The T3AR family's stages (:class:`~t3ar.method.base.Stage`), each built from one of its config groups by
:meth:`t3ar.method.contrastive.T3AR.stages`: the pool's inputs (which neighbours may serve as data), the BatchNorm
start, and two safeguards (:mod:`t3ar.method.safeguards`): the collapse fallback and WiSE-FT's interpolation. The
second stage is a module of its own (:mod:`t3ar.method.second_stage`). Each is off unless its option is set, and
then changes nothing else of the run: the same random streams (:func:`~t3ar.method.base.stream`: 9 the BatchNorm
start and the fallback's bn-adapt state, 11 the statistics after WiSE-FT) as when the loop ran them.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence

import torch

from t3ar.method.base import MethodSetup, Run, Stage, stream
from t3ar.method.bn_adapt import bn_adapt
from t3ar.method.config import train_groups
from t3ar.method.record import StepStats
from t3ar.method.safeguards import CollapseWatch, bn_adapt_state, class_entropy, interpolate

log = logging.getLogger(__name__)


class PoolInputs(Stage):
    """What the pool tells beside its images, checked and made ready for the method: with neighbours as data
    restricted to some sources (``pool_data.sources``), which pool images may serve (``MethodSetup.pool_allowed``);
    the probe's label draw controls need labelled neighbours as data."""

    def __init__(self, sources: Sequence[str] | None, labels_as_data: bool) -> None:
        self.sources, self.labels_as_data = sources, labels_as_data

    def setup(self, setup: MethodSetup) -> MethodSetup:
        if setup.config.mode == "train" and (switches := setup.probe.test_time_only()):
            raise ValueError(f"{', '.join(switches)}: test-time only (mode 'test'); with the target's labels (mode "
                             "'train') there is nothing to filter or to watch")
        draw = setup.probe.pool_label_draw
        if draw != "retrieved" and not (self.labels_as_data and setup.pool_known is not None):
            raise ValueError(f"pool_label_draw={draw!r} needs pool_labels and pool_labels.weight > 0")
        if self.sources is None:
            return setup
        if setup.pool_sources is None:
            raise ValueError("pool_data.sources needs the pool images' sources (pool_sources)")
        keep = set(self.sources)
        allowed = torch.tensor([s in keep for s in setup.pool_sources], dtype=torch.bool)
        return dataclasses.replace(setup, pool_allowed=allowed)


def _bn_adapt(run: Run, purpose: int) -> None:
    """bn-adapt of ``run.model`` on the target, its batches from the stream ``purpose``."""
    cfg = run.setup.config
    bn_adapt(run.model, run.setup.target, train_groups=train_groups(cfg), batch_size=cfg.batch_size,
             norm=run.setup.views.norm, generator=stream(cfg.seed, purpose))


class BatchNormStart(Stage):
    """The benchmarks' ``Probe.bn_start`` (a switch no round kept; off unless the probe sets it): the target's
    BatchNorm statistics first (what bn-adapt does, on the layers that train), then the steps."""

    def __init__(self) -> None:
        self.on = False

    def setup(self, setup: MethodSetup) -> MethodSetup:
        self.on = setup.probe.bn_start
        return setup

    def before(self, run: Run) -> None:
        if self.on:
            _bn_adapt(run, 9)


class WiseFT(Stage):
    """``safeguards.wise_alpha``: after the run each parameter becomes alpha x adapted + (1 - alpha) x start (the
    job's start, after the BatchNorm start), then the target's statistics are re-estimated for those weights. Not
    after a collapse (the fallback's state is the answer then)."""

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self.start_params: dict[str, torch.Tensor] = {}

    def before(self, run: Run) -> None:
        self.start_params = {k: p.detach().clone() for k, p in run.model.named_parameters()}

    def after(self, run: Run) -> None:
        if run.stopped:
            return
        interpolate(run.model, self.start_params, self.alpha)
        _bn_adapt(run, 11)


class CollapseFallback(Stage):
    """The benchmarks' ``Probe.collapse_fallback`` (a switch no round kept; ``fraction``, or the probe's when None;
    off when neither is set): watch the entropy of the class histogram of the job's pseudo-labels
    (``pl_class_entropy``, each step); when it falls under ``fraction`` of its start value, end the steps and
    restore the bn-adapt state (taken at the start: the BatchNorm start's own when that ran, the probe's
    ``bn_start``)."""

    def __init__(self, fraction: float | None = None) -> None:
        self.fraction, self.bn_started = fraction, False
        self.state: dict[str, torch.Tensor] = {}
        self.watch: CollapseWatch | None = None

    def setup(self, setup: MethodSetup) -> MethodSetup:
        if self.fraction is None:
            self.fraction = setup.probe.collapse_fallback
        self.bn_started = setup.probe.bn_start
        return setup

    def before(self, run: Run) -> None:
        if self.fraction is None:
            return
        cfg = run.setup.config
        self.state = bn_adapt_state(run.model, run.setup.target, done=self.bn_started,
                                    train_groups=train_groups(cfg),
                                    batch_size=cfg.batch_size, norm=run.setup.views.norm,
                                    generator=stream(cfg.seed, 9))

    def _entropy(self, run: Run) -> torch.Tensor:
        labels = run.method.final_labels() if run.method is not None else None
        if labels is None:
            raise ValueError(f"{run.setup.config.method} keeps no pseudo-labels: collapse_fallback cannot watch them")
        return class_entropy(labels, run.model.num_classes)

    def start(self, run: Run) -> None:
        if self.fraction is not None:
            self.watch = CollapseWatch(float(self._entropy(run)), self.fraction)

    def step_parts(self, run: Run) -> dict[str, torch.Tensor]:
        return {"pl_class_entropy": self._entropy(run)} if self.fraction is not None else {}

    def stop(self, run: Run, stats: StepStats) -> bool:
        value = getattr(stats, "pl_class_entropy", math.nan)
        if self.watch is None or not self.watch.fired(value):
            return False
        run.result.collapse_step = stats.step
        log.warning("collapse: the pseudo-labels' class entropy fell to %.3f (start %.3f) at step %d of %d; the "
                    "model is back to the bn-adapt state", value, self.watch.reference, stats.step, stats.total_steps)
        return True

    def after(self, run: Run) -> None:
        if run.result.collapse_step is not None:  # the run is over: the bn-adapt state is the job's answer
            run.model.load_state_dict(self.state)

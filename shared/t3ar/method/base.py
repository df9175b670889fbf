"""The interface every adaptation method implements, and what the loop hands it. Pure torch, no I/O.

A method is a :class:`MethodStep`: built once per job from a :class:`MethodSetup` (the placed data, the views,
the config), it says which parameters train and computes one step's loss; what it does beside its steps (before
them, after them) are its stages (:meth:`MethodStep.stages`, :class:`Stage`), and what it
reports per step is its record (:attr:`MethodStep.stats`). The loop in :mod:`t3ar.method.adapt` owns everything
around them: optimiser, schedule, mixed precision, timing, statistics and the one device sync per step. A method
registers its name and properties once (:mod:`t3ar.method.registry`).

Random streams (:func:`stream`), one per purpose so that the arms of a comparison share all but what differs:
1 target views, 2 bank / queue initialisation, 3 per-visit neighbour draws, 4 retrieval (the harness),
5 pool views, 6 pool images' weak views (neighbours as data), 7 labelled data draws, 8 their weak views,
9 bn_start's batches (and the collapse fallback's bn-adapt state), 10 the Fisher sample (EATA's, and the T3AR
family's anchor pass), 11 the BatchNorm statistics re-estimated after WiSE-FT's interpolation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import torch
from torch import nn

from t3ar.method.config import AdaptConfig, OptimiserConfig, train_groups
from t3ar.method.probe import NO_PROBE, Probe
from t3ar.method.record import AdaptResult, StepStats
from t3ar.method.views import Views
from t3ar.models.classifier import Classifier, configure_trainable


def stream(seed: int, purpose: int) -> torch.Generator:
    """A CPU generator for one purpose (views, bank init, ...) derived from the run's seed."""
    return torch.Generator().manual_seed(seed * 1_000_003 + purpose)


@dataclass
class StepOut:
    """A step's loss and its parts (tensors: read them after backward, in one device sync)."""

    loss: torch.Tensor
    parts: dict[str, torch.Tensor]  # field name of the method's record (MethodStep.stats) -> scalar tensor
    pseudo_labels: torch.Tensor  # [B] the labels the step trained on (pseudo-labels, or true in train mode)


@dataclass(frozen=True)
class MethodSetup:
    """What a method is built from, already checked and placed by the loop.

    ``target``: uint8 [N,3,S,S] on the device (or in host memory: indexed per step); ``labels``: [N] in train
    mode, else None; ``pool_images``: uint8 [P,3,S,S] for retrieval methods; ``neighbours`` ([N, k], fixed) or
    ``candidates`` ([N, m >= k], drawn anew per visit): local pool indices on the CPU, -1 = missing, at most one
    of them given; ``pool_sources``, ``pool_known``: what the pool tells of each pool image (its source, its pool
    label as a model class): see :func:`t3ar.method.adapt.adapt`; ``probe``: the benchmarks' controls and
    measurements (:class:`~t3ar.method.probe.Probe`; the product's runs have none).
    """

    target: torch.Tensor
    config: OptimiserConfig
    views: Views
    device: torch.device
    labels: torch.Tensor | None = None
    pool_images: torch.Tensor | None = None
    neighbours: torch.Tensor | None = None
    candidates: torch.Tensor | None = None
    pool_sources: Sequence[str] | None = None  # [P] the source of each pool image; None = not told
    pool_allowed: torch.Tensor | None = None  # [P] bool: may serve as data (a stage's setup derives it); None = all
    pool_known: torch.Tensor | None = None  # [P] the pool label of each pool image as a model class (-1 = none)
    probe: Probe = NO_PROBE


class MethodStep(ABC):
    """One adaptation method: which parameters train, its state, one step's loss.

    The loop calls, in order: :meth:`stages` (the method's stages, whose hooks it runs around the steps: see
    :class:`Stage`), :meth:`trainable_params` (before the optimiser exists), :meth:`create`
    (under the loop's autocast), then per batch :meth:`prepare` and :meth:`step` (model in train mode with its
    frozen BatchNorm layers in eval mode, under autocast; the loop runs backward and the optimiser) and
    :meth:`after_update`, and :meth:`pool_used` at the end. Each step's parts (:attr:`StepOut.parts`) become the
    fields of the method's record, :attr:`stats`. Subclasses say only what differs.

    :meth:`prepare` is the part of a step that needs no model: its views and its random draws. The loop may run
    it for the next batch on a background thread while the current batch's step runs
    (:mod:`t3ar.method.ahead`); its calls come one at a time, in batch order, so they draw every random stream
    in the same sequence either way.
    """

    #: the method's per-step record: :class:`~t3ar.method.record.StepStats` or a subclass with a field for each part
    #: its steps and stages report
    stats: ClassVar[type[StepStats]] = StepStats

    @classmethod
    def stages(cls, config: AdaptConfig) -> Sequence[Stage]:
        """The method's stages for a job with ``config``, in the order their hooks run (none by default)."""
        return ()

    @classmethod
    def trainable_params(cls, model: Classifier, config: OptimiserConfig) -> list[nn.Parameter]:
        """Set ``requires_grad`` on ``model`` and return what trains: by default the last
        ``config.train_groups`` backbone groups, the bottleneck and the classifier head."""
        return configure_trainable(model, train_groups(config), head=True)

    @classmethod
    @abstractmethod
    def create(cls, model: Classifier, setup: MethodSetup) -> MethodStep:
        """The method's state for one job (banks, queues, key encoders: whatever it keeps between steps)."""

    @abstractmethod
    def prepare(self, x: torch.Tensor, idx: torch.Tensor) -> Any:
        """The views (and random draws) of one batch: ``x`` uint8 [B,3,S,S] on the target's device, ``idx`` its
        target indices on the CPU. Never touches the model or the method's learnt state."""

    @abstractmethod
    def step(self, model: Classifier, ids: torch.Tensor, idx: torch.Tensor, prepared: Any) -> StepOut:
        """The loss of one batch: ``ids`` [B] (its target indices) on the target's device, ``idx`` the same
        indices on the CPU, ``prepared`` what :meth:`prepare` returned for it. Updates the method's state; never
        calls backward."""

    def after_update(self) -> bool:
        """Called after each optimiser update and the step's one device sync (so reading the step's scalars costs
        no further sync). True = the method has reset its trainable parameters to their start (SAR's recovery):
        the loop then clears the optimiser's state (momentum), as at the start of the job."""
        return False

    def pool_used(self) -> list[int]:
        """Sorted pool indices the job's steps used (retrieval methods; [] otherwise)."""
        return []

    def pool_labelled(self) -> dict[int, int]:
        """Pool index -> how many steps it served as labelled data (labelled neighbours as data; {} otherwise)."""
        return {}

    def final_labels(self) -> torch.Tensor | None:
        """[N] what each target image is labelled at the end (the filtered pseudo-labels, -1 = none; the true
        labels in train mode) for a second stage; None = the method keeps none."""
        return None


class StatelessMethod(MethodStep):
    """A method that keeps nothing between steps but the job's views (tent, SHOT-IM)."""

    def __init__(self, views: Views) -> None:
        self.views = views

    @classmethod
    def create(cls, model: Classifier, setup: MethodSetup) -> Self:
        return cls(setup.views)


@dataclass
class Run:
    """One job as a method's stages see it: the model, the job's inputs as the method is built from them
    (``setup``: the placed target, the config, the views and their normaliser), the generator of the batch order
    (the steps', then a stage's after them), mixed precision on or off, the result so far and, from
    :meth:`Stage.start` on, the method's state."""

    model: Classifier
    setup: MethodSetup
    generator: torch.Generator
    amp: bool
    result: AdaptResult
    method: MethodStep | None = None
    #: a stage ended the steps early (:meth:`Stage.stop`): the hooks after the steps see it
    stopped: bool = False


class Stage:
    """A part of a method's job beside its steps, built by the method from its config (:meth:`MethodStep.stages`).

    The loop calls, each hook on every stage in the method's order: :meth:`setup` (first: checks the job's inputs,
    derives what the method reads), :meth:`before` (before the method's state and optimiser exist), :meth:`start`
    (the state exists, before the first step), per step :meth:`step_parts` (read in the step's one device sync)
    and :meth:`stop`, then :meth:`after_steps` (the frozen layers still folded as the steps ran them) and
    :meth:`after`. Every hook does nothing by default.

    A stage that runs optimiser steps or passes over the target of its own declares them
    (:meth:`added_steps`, :meth:`added_passes`) and runs that many: the API's step cap counts them
    (:func:`t3ar.jobsize.planned_steps`, through the torch-free config group the stage is built from and reads its
    count from).
    """

    def added_steps(self) -> int:
        """Optimiser steps the stage runs after the method's."""
        return 0

    def added_passes(self) -> int:
        """Passes over the target with gradient but no optimiser step the stage runs (each counted as an epoch)."""
        return 0

    def setup(self, setup: MethodSetup) -> MethodSetup:
        """Check the job's inputs (ValueError when they do not fit) and return the setup the method is built from
        (``dataclasses.replace`` of it with what the stage derives); nothing has touched the model yet."""
        return setup

    def before(self, run: Run) -> None:
        """Before the method's trainable parameters, state and optimiser exist (the job's start)."""

    def start(self, run: Run) -> None:
        """The method's state exists (``run.method``); the first step comes next."""

    def step_parts(self, run: Run) -> dict[str, torch.Tensor]:
        """Scalars to record with the step (fields of the method's :attr:`MethodStep.stats`)."""
        return {}

    def stop(self, run: Run, stats: StepStats) -> bool:
        """After a step is recorded: True ends the steps (``run.stopped``)."""
        return False

    def after_steps(self, run: Run) -> None:
        """After the last step, the frozen layers still folded as the steps ran them."""

    def after(self, run: Run) -> None:
        """The job's end, before the model goes to eval mode."""

"""The interface every adaptation method implements, and what the loop hands it. Pure torch, no I/O.

A method is a :class:`MethodStep`: built once per job from a :class:`MethodSetup` (the placed data, the views,
the config), it says which parameters train and computes one step's loss. The loop in :mod:`t3ar.method.adapt`
owns everything around it: optimiser, schedule, mixed precision, timing, statistics and the one device sync
per step. A method registers its name and properties once (:mod:`t3ar.method.registry`).

Random streams (:func:`stream`), one per purpose so that the arms of a comparison share all but what differs:
1 target views, 2 bank / queue initialisation, 3 per-visit neighbour draws, 4 retrieval (the harness),
5 pool views, 6 pool images' weak views (neighbours as data), 7 labelled data draws, 8 their weak views,
9 bn_start's batches (and the collapse fallback's bn-adapt state), 10 the Fisher sample (EATA's, and the T3AR
family's anchor pass), 11 the BatchNorm statistics re-estimated after WiSE-FT's interpolation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Self

import torch
from torch import nn

from t3ar.method.config import AdaptConfig
from t3ar.method.probe import NO_PROBE, Probe
from t3ar.method.views import Views
from t3ar.models.classifier import Classifier, configure_trainable


def stream(seed: int, purpose: int) -> torch.Generator:
    """A CPU generator for one purpose (views, bank init, ...) derived from the run's seed."""
    return torch.Generator().manual_seed(seed * 1_000_003 + purpose)


@dataclass
class StepOut:
    """A step's loss and its parts (tensors: read them after backward, in one device sync)."""

    loss: torch.Tensor
    parts: dict[str, torch.Tensor]  # StepStats field name -> scalar tensor
    pseudo_labels: torch.Tensor  # [B] the labels the step trained on (pseudo-labels, or true in train mode)


@dataclass(frozen=True)
class MethodSetup:
    """What a method is built from, already checked and placed by the loop.

    ``target``: uint8 [N,3,S,S] on the device (or in host memory: indexed per step); ``labels``: [N] in train
    mode, else None; ``pool_images``: uint8 [P,3,S,S] for retrieval methods; ``neighbours`` ([N, k], fixed) or
    ``candidates`` ([N, m >= k], drawn anew per visit with ``config.redraw_neighbours``): local pool indices on
    the CPU, -1 = missing, at most one of them given; ``pool_allowed``, ``pool_known``: see
:func:`t3ar.method.adapt.adapt` (neighbours as data); ``probe``: the benchmarks' controls and measurements
(:class:`~t3ar.method.probe.Probe`; the product's runs have none).
    """

    target: torch.Tensor
    config: AdaptConfig
    views: Views
    device: torch.device
    labels: torch.Tensor | None = None
    pool_images: torch.Tensor | None = None
    neighbours: torch.Tensor | None = None
    candidates: torch.Tensor | None = None
    pool_allowed: torch.Tensor | None = None  # [P] bool: may serve as data (config.pool_data_sources); None = all
    pool_known: torch.Tensor | None = None  # [P] the pool label of each pool image as a model class (-1 = none)
    probe: Probe = NO_PROBE


class MethodStep(ABC):
    """One adaptation method: which parameters train, its state, one step's loss.

    The loop calls, in order: :meth:`trainable_params` (before the optimiser exists), :meth:`create` (under the
    loop's autocast), then per batch :meth:`prepare` and :meth:`step` (model in train mode with its frozen
    BatchNorm layers in eval mode, under autocast; the loop runs backward and the optimiser) and
    :meth:`after_update`, and :meth:`pool_used` at the end. Subclasses say only what differs.

    :meth:`prepare` is the part of a step that needs no model: its views and its random draws. The loop may run
    it for the next batch on a background thread while the current batch's step runs
    (:mod:`t3ar.method.ahead`); its calls come one at a time, in batch order, so they draw every random stream
    in the same sequence either way.
    """

    @classmethod
    def trainable_params(cls, model: Classifier, config: AdaptConfig) -> list[nn.Parameter]:
        """Set ``requires_grad`` on ``model`` and return what trains: by default the last
        ``config.train_groups`` backbone groups, the bottleneck and the classifier head."""
        return configure_trainable(model, config.train_groups, head=True)

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

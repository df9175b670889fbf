"""What the adaptation loop (:func:`t3ar.method.adapt.adapt`) records: one step (:class:`StepStats`) and the job
(:class:`AdaptResult`).

:class:`StepStats`' fields are what every method reports; a method with more to say declares a subclass
(:attr:`t3ar.method.base.MethodStep.stats`) and the loop fills it with the step's parts by name: a part the record
has no field for is an error, never dropped.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field


@dataclass
class StepStats:
    """One optimiser step, reported to ``on_step``: what every method reports. NaN = not measured for this run.

    ``loss_ce``, ``loss_contrastive``, ``loss_diversity``, ``pl_change_rate``: the method's parts where it has
    them (0.0 where not). ``pl_accuracy`` (``Probe.diagnostic_labels``): accuracy of the labels the step trained on
    (T3AR family: the filtered pseudo-labels, or the true labels in train mode; AdaContrast: its refined
    pseudo-labels; tent / SHOT-IM: the argmax of the logits their loss is computed on). ``seconds_augment``: the
    wall time the step's views took to make (on the background thread when made ahead, overlapping the step
    before); ``seconds_forward_backward``: the rest of the step's wall time.
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
    #: optimiser steps the method's stages ran after ``steps`` (the T3AR family's second stage)
    second_stage_steps: int = 0
    #: the step after which a stage ended the run (the T3AR family's collapse fallback: the model was reset to the
    #: bn-adapt state); None = none did
    collapse_step: int | None = None

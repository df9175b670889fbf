"""The T3AR family's safeguards against self-training on its own wrong pseudo-labels: SAR's and EATA's
mechanisms (Niu et al., ICLR 2023 and ICML 2022) and WiSE-FT's weight interpolation (Wortsman et al., CVPR 2022)
as options, each off by default. Pure torch: tensors and modules in, no I/O.

* **Reliable samples** (:func:`reliable_weights`): the cross-entropy counts only the samples whose prediction
  entropy is under ``fraction`` x ln C (SAR and EATA: 0.4), optionally re-weighted by 1 / exp(H - E0) (EATA).
* **An anchor to the start weights** (:class:`Anchor`): weight x sum F (theta - theta_0)^2 over the trainable
  parameters, F = 1 (L2-SP, Li et al. 2018) or the Fisher diagonal of the model's own pseudo-labels on the target
  at the start (:func:`fisher_diagonal`; EATA's anti-forgetting term, here on the target itself: the job has no
  held-out source data).
* **Collapse detection** (:func:`class_entropy`, :class:`CollapseWatch`): the entropy of the class histogram of
  the job's current pseudo-labels falling under a fraction of its start value: the predictions have fallen onto
  a few classes. The loop then restores the bn-adapt state (:func:`bn_adapt_state`) and ends.
* **Weight-space interpolation** (:func:`interpolate`): the final parameters alpha x adapted + (1 - alpha) x start.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from t3ar.method.augment import Normalizer
from t3ar.method.bn_adapt import bn_adapt
from t3ar.method.schedule import epoch_batches
from t3ar.models.classifier import Classifier, eval_norms, freeze_frozen_norms, frozen_norm_stats

__all__ = ["Anchor", "CollapseWatch", "bn_adapt_state", "class_entropy", "entropy", "filtered_mean",
           "fisher_diagonal", "interpolate", "reliable_weights", "stable_fisher"]


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """[B] the entropy (nats) of each row's softmax."""
    logp = F.log_softmax(logits.float(), dim=1)
    return -(logp.exp() * logp).sum(1)


def reliable_weights(logits: torch.Tensor, fraction: float, reweight: bool = False) -> torch.Tensor:
    """[B] each sample's weight in the cross-entropy: 0 where its prediction's entropy H is at or over
    E0 = ``fraction`` x ln C (unreliable: SAR's and EATA's filter), else 1, or with ``reweight`` EATA's
    1 / exp(H - E0) (above 1: the more confident, the more it counts). ``logits`` [B, C], without gradient."""
    margin = fraction * math.log(logits.shape[1])
    h = entropy(logits.detach())
    keep = (h < margin).float()
    return keep * torch.exp(margin - h) if reweight else keep


def filtered_mean(per_row: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The mean of ``per_row`` x ``weights`` over the rows that count (weight > 0), as SAR and EATA average their
    filtered loss; 0 (with the graph kept) when none does."""
    kept = (weights > 0).sum().clamp(min=1)
    return (per_row * weights).sum() / kept


#: the anchor's curvature 2 x weight x F times the lr is capped at this, per parameter (gradient descent is stable
#: below 2, heavy-ball momentum 0.9 below 3.8, Nesterov's below about 1.4): see :func:`stable_fisher`
ANCHOR_STABILITY = 1.0


def stable_fisher(lr: float, weight: float) -> float:
    """The largest F whose anchor term ``weight`` x F x (theta - theta_0)^2, of curvature 2 weight F, SGD follows
    stably at ``lr`` (the job's largest: the schedule only lowers it): lr x 2 weight F <= :data:`ANCHOR_STABILITY`.
    Infinite when the weight is 0. EATA's paper weight (2000) with a Fisher value of 1 at lr 0.001 is at 4: each step
    overshoots theta_0 further, and the weights grow without bound (seen: ~1e23 and infinite BatchNorm variances)."""
    return ANCHOR_STABILITY / (2 * weight * lr) if weight > 0 else math.inf


@dataclass
class Anchor:
    """``weight`` x sum_i F_i (theta_i - theta_0,i)^2 over ``params`` (theta_0: their values when made; F: the
    Fisher diagonal, or 1 for L2-SP)."""

    params: list[nn.Parameter]
    start: list[torch.Tensor]
    weight: float
    fisher: list[torch.Tensor] | None = None
    #: how many values of F were lowered to the stable cap when made (:meth:`at` with an lr)
    capped: int = 0

    @classmethod
    def at(cls, params: list[nn.Parameter], weight: float, fisher: list[torch.Tensor] | None = None, *,
           lr: float | None = None) -> Anchor:
        """An anchor to the current values of ``params``. With ``lr`` (the job's largest), each F is capped at
        :func:`stable_fisher` (L2-SP's F = 1 too: its weight is lowered to the cap), so that the penalty alone can
        never make SGD diverge; the anchor keeps its full weight wherever it is stable."""
        if fisher is not None and len(fisher) != len(params):
            raise ValueError(f"one Fisher diagonal per parameter: {len(fisher)} for {len(params)}")
        capped = 0
        if lr is not None:
            cap = stable_fisher(lr, weight)
            if fisher is not None:
                capped = sum(int((f > cap).sum()) for f in fisher)
                fisher = [f.clamp(max=cap) for f in fisher]
            elif cap < 1:  # L2-SP: F = 1 everywhere
                capped = sum(p.numel() for p in params)
                weight *= cap
        return cls(params, [p.detach().float().clone() for p in params], weight, fisher, capped)

    def __call__(self) -> torch.Tensor:
        terms = []
        for i, (p, p0) in enumerate(zip(self.params, self.start, strict=True)):
            d2 = (p.float() - p0).pow(2)
            terms.append((d2 if self.fisher is None else d2 * self.fisher[i]).sum())
        return self.weight * torch.stack(terms).sum()


def fisher_diagonal(model: Classifier, params: list[nn.Parameter], target: torch.Tensor, *, norm: Normalizer,
                    batch_size: int, generator: torch.Generator, bn_fixed: bool = False) -> list[torch.Tensor]:
    """EATA's Fisher diagonal of ``params`` on ``target`` (uint8 [N,3,S,S], the evaluation transform): per batch,
    the squared gradient of the mean cross-entropy against the model's own argmax, averaged over one pass in
    batches of ``batch_size``. BatchNorm as in the family's steps (batch statistics in the layers that train,
    running ones with ``bn_fixed``); running statistics (BatchNorm's batch counters aside, as in the family's
    other auxiliary passes), parameters and their ``.grad`` are left untouched."""
    fisher = [torch.zeros_like(p, dtype=torch.float32) for p in params]
    batches = epoch_batches(len(target), min(batch_size, len(target)), generator)
    was_training = model.training
    model.train()
    freeze_frozen_norms(model)
    if bn_fixed:
        eval_norms(model)
    try:
        with frozen_norm_stats(model), torch.enable_grad():
            for idx in batches:
                logits = model(norm(target[idx.to(target.device)])).float()
                loss = F.cross_entropy(logits, logits.detach().argmax(1))
                grads = torch.autograd.grad(loss, params, allow_unused=True)
                for f, g in zip(fisher, grads, strict=True):
                    if g is not None:
                        f += g.float().pow(2)
    finally:
        model.train(was_training)
    return [f / len(batches) for f in fisher]


def class_entropy(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """The entropy (nats) of the class histogram of ``labels`` ([N], -1 = none: not counted); 0 when none."""
    counts = torch.bincount(labels[labels >= 0], minlength=num_classes).float()
    p = counts / counts.sum().clamp(min=1)
    return -(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum()


@dataclass
class CollapseWatch:
    """Fires when the pseudo-labels' class-histogram entropy falls under ``fraction`` x its value at the start
    (``reference``): the predictions have fallen onto a few classes (exp(H) is the histogram's effective number of
    classes: at ``fraction`` 0.5, sqrt of the start's)."""

    reference: float
    fraction: float

    def fired(self, value: float) -> bool:
        return value < self.fraction * self.reference


def bn_adapt_state(model: Classifier, target: torch.Tensor, *, done: bool, train_groups: int | None,
                   batch_size: int, norm: Normalizer, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """A copy of the bn-adapt state of ``model``: its parameters with the target's BatchNorm statistics in the
    layers ``bn-adapt`` re-estimates. ``done``: ``model`` already is that state (``bn_start`` ran), else a copy of
    it takes the target's statistics (one no-gradient pass; ``model`` untouched)."""
    if done:
        return {k: v.detach().clone() for k, v in model.state_dict().items()}
    twin = copy.deepcopy(model)
    bn_adapt(twin, target, train_groups=train_groups, batch_size=batch_size, norm=norm, generator=generator)
    return {k: v.detach() for k, v in twin.state_dict().items()}


@torch.no_grad()
def interpolate(model: nn.Module, start: dict[str, torch.Tensor], alpha: float) -> None:
    """WiSE-FT in place: every parameter of ``model`` becomes ``alpha`` x itself + (1 - ``alpha``) x its value in
    ``start`` (name -> tensor). Buffers (BatchNorm statistics) are left to the caller."""
    for name, p in model.named_parameters():
        p.lerp_(start[name].to(p.device, p.dtype), 1.0 - alpha)

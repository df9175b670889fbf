"""SAR (Niu et al., ICLR 2023, "Towards Stable Test-Time Adaptation in Dynamic Wild World"): entropy minimisation
made safe by three mechanisms, on the affine parameters of the normalisation layers below the top backbone group.

* **Reliable samples**: only images whose prediction entropy is below E0 = 0.4 ln C train
  (:mod:`t3ar.method.reliable`).
* **Sharpness-aware step** (SAM, rho = 0.05): the gradient is taken at the weights perturbed towards the steepest
  ascent of the reliable entropy, w + rho g / ||g||, where it is re-filtered (an image must be reliable at both).
* **Recovery**: a moving average (0.9) of that second loss below 0.2 means collapse (everything predicted with
  certainty); the trainable parameters go back to their state at the start of the job, the optimiser's momentum is
  cleared and the average forgotten.

How the two passes fit the loop, which owns the optimiser and runs one backward per step
(:mod:`t3ar.method.adapt`): :meth:`SAR.step` runs the first forward, takes its gradient itself with
``torch.autograd.grad`` (no ``.grad`` is touched) and runs the second forward through
``torch.func.functional_call`` with every trainable parameter replaced by ``p + e`` (``e`` computed without
gradient). The model's own parameters are never modified, so nothing needs restoring, and the loss it returns
has, through ``p + e``, exactly SAM's gradient ∇L(w + e) with respect to ``p``: the loop's backward and optimiser
step (its loss scaling included) then make SAM's update at ``w``. The first pass's loss is multiplied by
:data:`FIRST_PASS_SCALE` before its gradient is taken (only its direction matters; under CUDA mixed precision
float16 gradients would underflow otherwise), and a non-finite first gradient skips the perturbation for that
step (a plain reliable-entropy step). The second forward leaves the BatchNorm running statistics alone: each batch
counts into them once, at the unperturbed weights. The recovery check runs in :meth:`SAR.after_update`, after
the optimiser's update, as in the reference code, and reads the second loss only after the loop's own sync.

Where this departs from the reference code (mr-eggplant/SAR), and why:

* Every BatchNorm layer normalises with the batch's statistics during the steps, as in SAR, and its running
  statistics follow them (momentum): the checkpoint is evaluated with those, since the product serves a model,
  not the batches' own statistics. The recovery resets the trainable parameters and the optimiser state, not
  the running statistics (SAR has none to reset: it drops them and always normalises with the batch).
* "Top layers" (ResNet's layer4, ViT's last three blocks) are the last backbone group here
  (:data:`SKIP_TOP_GROUPS`) and everything above it (the bottleneck's BatchNorm).
* A batch without a reliable image still makes an optimiser step (the loop steps every batch): its gradient is
  zero, but SGD's momentum and weight decay move the weights (the reference's loss is NaN there). The lr,
  momentum, weight decay and schedule are the loop's (``AdaptConfig``); the paper uses SGD, lr 0.00025 at
  batch 64 (ResNet-50), momentum 0.9, no schedule.
"""

from __future__ import annotations

import logging
from typing import Self

import torch
from torch import nn
from torch.func import functional_call

from t3ar.method.base import MethodSetup, MethodStep, StepOut
from t3ar.method.config import OptimiserConfig
from t3ar.method.reliable import entropy_margin, masked_mean, norm_affine_params, running_stats_kept, sample_entropy
from t3ar.method.views import Views
from t3ar.models.classifier import Classifier, iter_batchnorms

log = logging.getLogger(__name__)

#: SAM's neighbourhood radius (the paper's rho)
RHO = 0.05
#: the moving average of the second loss and the collapse threshold of the recovery (the paper's e_m)
EMA = 0.9
RESET_BELOW = 0.2
#: backbone groups (from the top) whose normalisation layers do not train, nor the bottleneck's (SAR's top layers)
SKIP_TOP_GROUPS = 1
#: the first pass's loss multiplier before its gradient is taken (a direction: any scale gives the same e)
FIRST_PASS_SCALE = 2.0**12


def perturbation(grads: list[torch.Tensor], rho: float = RHO) -> list[torch.Tensor]:
    """SAM's e = rho g / ||g|| (one norm over every parameter); zeros when the norm is 0 or not finite."""
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
    ok = torch.isfinite(norm) & (norm > 0)
    scale = torch.where(ok, rho / (norm + 1e-12), torch.zeros_like(norm))
    return [torch.where(ok, g.float() * scale, torch.zeros_like(g, dtype=torch.float32)) for g in grads]


class SAR(MethodStep):
    def __init__(self, views: Views, model: Classifier, params: list[nn.Parameter]) -> None:
        self.views = views
        self.params = params
        names = {id(p): n for n, p in model.named_parameters()}
        self.names = [names[id(p)] for p in params]
        self.start = [p.detach().clone() for p in params]
        self.margin = entropy_margin(model.num_classes)
        self.ema: float | None = None
        self.resets = 0
        #: images seen, reliable at the first pass, trained on (reliable at both passes): device counters
        self.counts = torch.zeros(3, device=params[0].device) if params else torch.zeros(3)
        self._last: torch.Tensor | None = None  # [loss, any image trained on] of the step awaiting its update

    @classmethod
    def trainable_params(cls, model: Classifier, config: OptimiserConfig) -> list[nn.Parameter]:
        return norm_affine_params(model, SKIP_TOP_GROUPS)

    @classmethod
    def create(cls, model: Classifier, setup: MethodSetup) -> Self:
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("SAR needs normalisation layers with affine parameters below the top backbone group")
        return cls(setup.views, model, params)

    def prepare(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return self.views.plain(x)

    def step(self, model: Classifier, ids: torch.Tensor, idx: torch.Tensor, prepared: torch.Tensor) -> StepOut:
        for m in iter_batchnorms(model):  # every BatchNorm normalises with the batch, trained or not (SAR)
            m.train()
        logits = model(prepared)
        ent = sample_entropy(logits)
        reliable = ent < self.margin
        grads = torch.autograd.grad(masked_mean(ent, reliable) * FIRST_PASS_SCALE, self.params, allow_unused=True)
        with torch.no_grad():
            e = perturbation([g if g is not None else torch.zeros_like(p) for g, p in zip(grads, self.params,
                                                                                         strict=True)])
        perturbed = {n: p + d.to(p.dtype) for n, p, d in zip(self.names, self.params, e, strict=True)}
        with running_stats_kept(model):
            ent2 = sample_entropy(functional_call(model, perturbed, (prepared,)))
        trained = reliable & (ent2 < self.margin)
        loss = masked_mean(ent2, trained)
        with torch.no_grad():
            self.counts += torch.stack([ent.new_full((), float(len(ent))),
                                        reliable.sum().float(), trained.sum().float()]).to(self.counts.device)
            self._last = torch.stack([loss.detach(), trained.any().float()])
        return StepOut(loss, {}, logits.detach().argmax(1))

    def after_update(self) -> bool:
        if self._last is None:
            return False
        value, any_trained = self._last.tolist()
        self._last = None
        if not any_trained:  # no reliable image: the reference's loss is NaN and leaves the average alone
            return False
        self.ema = value if self.ema is None else EMA * self.ema + (1 - EMA) * value
        if self.ema >= RESET_BELOW:
            return False
        self.reset()
        return True

    def reset(self) -> None:
        """The trainable parameters back to the start of the job; the moving average forgotten."""
        with torch.no_grad():
            for p, p0 in zip(self.params, self.start, strict=True):
                p.copy_(p0)
        self.ema = None
        self.resets += 1
        log.info("SAR: moving average of the entropy under %.2f: parameters reset to the start (reset %d)",
                 RESET_BELOW, self.resets)

    def selection(self) -> dict[str, int]:
        """Images seen, reliable at the first pass and trained on so far, and the resets (a diagnostic)."""
        seen, reliable, trained = (int(v) for v in self.counts.tolist())
        return {"seen": seen, "reliable": reliable, "trained": trained, "resets": self.resets}

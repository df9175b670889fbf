"""EATA (Niu et al., ICML 2022, "Efficient Test-Time Model Adaptation without Forgetting"): entropy minimisation on
the affine parameters of the normalisation layers, over the images that are reliable and not redundant, with an
anchor against forgetting.

* **Reliable**: prediction entropy below E0 = 0.4 ln C (:mod:`t3ar.method.reliable`).
* **Not redundant**: the cosine similarity of the image's softmax to a moving average (0.9) of the softmax of the
  images selected so far is below ``D_MARGIN`` (0.05). The first batch has no average yet: reliability alone
  selects there; a batch that selects nothing leaves the average as it is.
* **Re-weighted**: each selected image's entropy is weighted by 1 / exp(entropy - E0) (more certain, more weight),
  the loss their mean.
* **Fisher anchor**: ``FISHER_ALPHA`` * sum F (theta - theta0)^2, theta0 the parameters at the start of the job, F
  the diagonal Fisher information estimated once, before the first step, on the target's own unlabelled images
  with the model's pseudo-labels (argmax): up to ``FISHER_SAMPLES`` of them (a seeded subset, stream 10 of
  :func:`t3ar.method.base.stream`), in batches of the job's batch size, BatchNorm on the batch's statistics.
  No source data and no label is used (EATA estimates it on 2,000 unlabelled in-distribution test images).

Where this departs from the reference code (mr-eggplant/EATA), and why:

* The reference skips the optimiser step when a batch selects no image; the loop steps every batch, so such a
  batch's step has the anchor's gradient alone (which pulls towards theta0) plus SGD's momentum and weight decay.
* BatchNorm layers normalise with the batch's statistics during the steps (as in EATA) and their running
  statistics follow them (momentum): the checkpoint is evaluated with those.
* **The anchor is capped where SGD cannot follow it.** Its curvature is 2 alpha F per parameter; at the paper's lr
  (0.00025 at batch 64) alpha = 2000 is stable for ImageNet's Fisher values, but at a job's lr (1e-3 by default)
  and on our target's Fisher (up to 2.2 on an emoji shift, measured in a scratch run of the benchmark's quick data
  at 40 steps) lr * 2 alpha F reached 8.7 and EATA fell to 11 % top-1 on a cell where TENT reached 24 %. Each
  Fisher value is clamped to :func:`stable_fisher` (lr * 2 alpha F <= 1): the anchor keeps its full weight on every
  parameter SGD can hold there and is as stiff as SGD can follow on the others. The job's log says how many values
  were capped.
* The lr, momentum, weight decay and schedule are the loop's (``AdaptConfig``); the paper uses SGD, lr 0.00025 at
  batch 64, momentum 0.9 on ImageNet-C. ``FISHER_ALPHA`` (2,000) and ``D_MARGIN`` (0.05) are the paper's ImageNet
  values, for 1,000 classes; its CIFAR-10 setting uses a margin of 0.4 (the redundancy margin depends on the number
  of classes: a uniform average is at cosine 1/sqrt(C) from a one-hot prediction).
"""

from __future__ import annotations

import logging
from typing import Self

import torch
import torch.nn.functional as F
from torch import nn

from t3ar.method.base import MethodSetup, MethodStep, StepOut, stream
from t3ar.method.config import OptimiserConfig
from t3ar.method.reliable import entropy_margin, fisher_diagonal, fisher_penalty, norm_affine_params, sample_entropy
from t3ar.method.safeguards import stable_fisher
from t3ar.method.views import Views
from t3ar.models.classifier import Classifier, freeze_frozen_norms

log = logging.getLogger(__name__)

#: the redundancy margin on the cosine similarity to the moving average of the selected images' softmax (ImageNet)
D_MARGIN = 0.05
#: the moving average's momentum
PROBS_EMA = 0.9
#: the Fisher anchor's weight (EATA's beta on ImageNet)
FISHER_ALPHA = 2000.0
#: how many target images (at most) the Fisher information is estimated on
FISHER_SAMPLES = 2000
#: the Fisher sample's random stream (t3ar.method.base.stream)
FISHER_STREAM = 10


class EATA(MethodStep):
    def __init__(self, views: Views, model: Classifier, params: list[nn.Parameter], fisher: list[torch.Tensor]) -> None:
        self.views = views
        self.params = params
        self.anchor = [p.detach().float().clone() for p in params]
        self.fisher = fisher
        self.margin = entropy_margin(model.num_classes)
        device = params[0].device
        self.probs = torch.zeros(model.num_classes, device=device)  # the moving average of the selected softmax
        self.has_probs = torch.zeros((), dtype=torch.bool, device=device)
        #: images seen, reliable, selected (reliable and not redundant): device counters
        self.counts = torch.zeros(3, device=device)

    @classmethod
    def trainable_params(cls, model: Classifier, config: OptimiserConfig) -> list[nn.Parameter]:
        return norm_affine_params(model)

    @classmethod
    def create(cls, model: Classifier, setup: MethodSetup) -> Self:
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("EATA needs normalisation layers with affine parameters")
        model.train()
        freeze_frozen_norms(model)
        fisher = fisher_diagonal(model, params, setup.target, setup.views.plain, batch_size=setup.config.batch_size,
                                 samples=FISHER_SAMPLES, generator=stream(setup.config.seed, FISHER_STREAM))
        top = max(float(f.max()) for f in fisher)
        cap = stable_fisher(setup.config.lr, FISHER_ALPHA)
        capped = sum(int((f > cap).sum()) for f in fisher)
        log.info("EATA: Fisher information on %d target images, largest %.3g; %d of %d values capped at %.3g (the "
                 "anchor's curvature SGD follows at lr %.3g)", min(len(setup.target), FISHER_SAMPLES), top, capped,
                 sum(f.numel() for f in fisher), cap, setup.config.lr)
        return cls(setup.views, model, params, [f.clamp(max=cap) for f in fisher])

    def prepare(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return self.views.plain(x)

    def select(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(per-image entropy [B], reliable [B], selected [B]) of a batch's logits, and the moving average of the
        selected images' softmax updated (no gradient, no host sync)."""
        ent = sample_entropy(logits)
        reliable = ent < self.margin
        with torch.no_grad():
            probs = logits.detach().float().softmax(1)
            # a zero average (none yet) is at cosine 0 from everything: reliability alone selects
            cos = F.cosine_similarity(self.probs[None], probs, dim=1)
            selected = reliable & (cos.abs() < D_MARGIN)
            n = selected.sum()
            mean = (probs * selected[:, None]).sum(0) / n.clamp(min=1)
            moved = torch.where(self.has_probs, PROBS_EMA * self.probs + (1 - PROBS_EMA) * mean, mean)
            self.probs = torch.where(n > 0, moved, self.probs)
            self.has_probs = self.has_probs | (n > 0)
            self.counts += torch.stack([ent.new_full((), float(len(ent))), reliable.sum().float(),
                                        n.float()]).to(self.counts.device)
        return ent, reliable, selected

    def penalty(self) -> torch.Tensor:
        """The Fisher anchor, unweighted: sum F (theta - theta0)^2."""
        return fisher_penalty(self.params, self.fisher, self.anchor)

    def step(self, model: Classifier, ids: torch.Tensor, idx: torch.Tensor, prepared: torch.Tensor) -> StepOut:
        logits = model(prepared)
        ent, _, selected = self.select(logits)
        weight = selected.float() * torch.exp(self.margin - ent.detach())
        loss = (weight * ent).sum() / selected.sum().clamp(min=1) + FISHER_ALPHA * self.penalty()
        return StepOut(loss, {}, logits.detach().argmax(1))

    def selection(self) -> dict[str, int]:
        """Images seen, reliable and selected so far (a diagnostic)."""
        seen, reliable, selected = (int(v) for v in self.counts.tolist())
        return {"seen": seen, "reliable": reliable, "selected": selected}

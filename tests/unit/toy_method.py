"""A toy adaptation method, whole in one file: self-training of the bottleneck and head on the weak view's own
argmax. One registration, at the definition, is all it takes for ``t3ar adapt --method toy-self-training``, the
API's POST /adapt and job sizing to know it (tests/unit/test_toy_method.py); no other module names it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from t3ar.method.base import StatelessMethod, StepOut
from t3ar.method.config import AdaptConfig
from t3ar.method.registry import register_method
from t3ar.models.classifier import Classifier, configure_trainable

NAME = "toy-self-training"


@register_method(NAME, "self-training on the weak view's own argmax, bottleneck and head only")
class ToySelfTraining(StatelessMethod):
    @classmethod
    def trainable_params(cls, model: Classifier, config: AdaptConfig) -> list[nn.Parameter]:
        return configure_trainable(model, 0, head=True)  # no backbone group trains

    def prepare(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return self.views.weak(x)

    def step(self, model: Classifier, ids: torch.Tensor, idx: torch.Tensor, prepared: torch.Tensor) -> StepOut:
        logits = model(prepared)
        labels = logits.detach().argmax(1)
        loss = F.cross_entropy(logits.float(), labels)
        return StepOut(loss, {"loss_ce": loss.detach()}, labels)

"""SHOT-IM (Liang et al., ICML 2020, SHOT without its clustering pseudo-labels): information maximisation on
weak views (confident per image, diverse on average) with the classifier head frozen (the source hypothesis)."""

from __future__ import annotations

import torch
from torch import nn

from t3ar.method import losses
from t3ar.method.base import StatelessMethod, StepOut
from t3ar.method.config import OptimiserConfig, train_groups
from t3ar.models.classifier import Classifier, configure_trainable


class ShotIM(StatelessMethod):
    @classmethod
    def trainable_params(cls, model: Classifier, config: OptimiserConfig) -> list[nn.Parameter]:
        return configure_trainable(model, train_groups(config), head=False)

    def prepare(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return self.views.weak(x)

    def step(self, model: Classifier, ids: torch.Tensor, idx: torch.Tensor, prepared: torch.Tensor) -> StepOut:
        logits = model(prepared)
        return StepOut(losses.information_maximisation(logits), {}, logits.detach().argmax(1))

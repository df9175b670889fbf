"""TENT (Wang et al., ICLR 2021): minimise the prediction entropy of the test images as they are, training only
the BatchNorm affine parameters (every BatchNorm normalises with the batch's statistics)."""

from __future__ import annotations

import torch
from torch import nn

from t3ar.method import losses
from t3ar.method.base import StatelessMethod, StepOut
from t3ar.method.config import OptimiserConfig
from t3ar.models.classifier import Classifier, iter_batchnorms


class Tent(StatelessMethod):
    @classmethod
    def trainable_params(cls, model: Classifier, config: OptimiserConfig) -> list[nn.Parameter]:
        for p in model.parameters():
            p.requires_grad_(False)
        params: list[nn.Parameter] = []
        for bn in iter_batchnorms(model):
            for p in (bn.weight, bn.bias):
                if p is not None:
                    p.requires_grad_(True)
                    params.append(p)
        return params

    def prepare(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return self.views.plain(x)

    def step(self, model: Classifier, ids: torch.Tensor, idx: torch.Tensor, prepared: torch.Tensor) -> StepOut:
        logits = model(prepared)
        return StepOut(losses.entropy(logits), {}, logits.detach().argmax(1))

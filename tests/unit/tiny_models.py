"""A tiny CPU backbone for tests of the adaptation loop (BatchNorm in every stage, 8-d features), the tiny
seeded adaptation problem the loop's tests share (:func:`tiny_problem`) and a run of a method through the loop on
it that keeps the method's instance (:func:`confident_run`)."""

import math
from typing import Any, TypeVar

import pytest
import torch
from torch import nn

from t3ar.device import seed_everything
from t3ar.method import config as method_config
from t3ar.method.adapt import adapt
from t3ar.method.config import AdaptConfig, adapt_config
from t3ar.models.classifier import Classifier


class TinyBackbone(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.BatchNorm2d(8), nn.ReLU())
        self.stage = nn.Sequential(nn.Conv2d(8, 8, 3, 1, 1), nn.BatchNorm2d(8), nn.ReLU(),
                                   nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.num_features = 8

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stage(self.stem(x))


def tiny_problem(n_target: int = 12, n_pool: int = 9, k: int = 3, *, seed: int = 1, model_seed: int = 0,
                 device: torch.device | None = None
                 ) -> tuple[Classifier, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(model, target, pool, neighbours): a 3-class tiny classifier built after ``seed_everything(model_seed)``
    (on ``device``, default CPU), then from one generator seeded with ``seed``, in this order, ``n_target``
    target and ``n_pool`` pool uint8 16×16 images and ``k`` neighbour indices per target image. The same
    arguments give the same tensors, so a test can compare runs that differ in one option."""
    seed_everything(model_seed)
    model = Classifier(TinyBackbone(), 8, 3, 16).to(device or torch.device("cpu"))
    g = torch.Generator().manual_seed(seed)
    target = torch.randint(0, 256, (n_target, 3, 16, 16), dtype=torch.uint8, generator=g)
    pool = torch.randint(0, 256, (n_pool, 3, 16, 16), dtype=torch.uint8, generator=g)
    nbr = torch.randint(0, n_pool, (n_target, k), generator=g)
    return model, target, pool, nbr


M = TypeVar("M")


def confident_run(monkeypatch: pytest.MonkeyPatch, cls: type[M], method: str, **fields: Any
                  ) -> tuple[Classifier, dict[str, torch.Tensor], M]:
    """``method`` (its class ``cls``) through the loop on the tiny problem, 2 epochs of batch 4 at lr 0.05 with the
    other ``fields`` of its config, its head made confident (the random tiny model is near uniform: no image would
    be reliable); returns the model, its start state and the method's instance the loop made."""
    made: list[M] = []
    create = cls.create.__func__  # type: ignore[attr-defined]

    def capture(c: type[M], *a: Any) -> M:
        made.append(create(c, *a))
        return made[-1]

    monkeypatch.setattr(cls, "create", classmethod(capture))
    model, target, _, _ = tiny_problem(seed=5)
    with torch.no_grad():
        model.head.parametrizations.weight.original0.mul_(6)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    adapt(model, target, adapt_config(method=method, epochs=2, batch_size=4, lr=0.05, **fields), mean=(0.5,) * 3,
          std=(0.5,) * 3, device=torch.device("cpu"))
    return model, start, made[0]


def tiny_config(method: str, **fields: object) -> AdaptConfig:
    """``method``'s config with those of ``fields`` its config has (a loop over every method sets k and bank_size,
    which only some have; a config refuses another method's option)."""
    accepted = method_config.config_class(method).flat_fields()
    return adapt_config(method=method, **{k: v for k, v in fields.items() if k in accepted or k == "mode"})


#: the class count of :class:`Affine` and the reliable-entropy margin SAR and EATA use with it (0.4 ln C)
AFFINE_CLASSES = 4
AFFINE_E0 = 0.4 * math.log(AFFINE_CLASSES)


class Affine(nn.Module):
    """logits = x * weight + bias over :data:`AFFINE_CLASSES` classes: at the start its output is its input
    (hand-made logits), for the entropy methods' tests."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(AFFINE_CLASSES))
        self.bias = nn.Parameter(torch.zeros(AFFINE_CLASSES))
        self.num_classes = AFFINE_CLASSES

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight + self.bias


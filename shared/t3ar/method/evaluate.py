"""Evaluation: top-1 and per-class accuracy. Pure torch."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from t3ar.method.augment import Normalizer


@torch.no_grad()
def predict(model: nn.Module, images: torch.Tensor, norm: Normalizer, batch_size: int = 256) -> torch.Tensor:
    """Logits [N, C] for uint8 images [N,3,S,S] (eval mode, no augmentation)."""
    was_training = model.training
    model.eval()
    outs = [model(norm(images[i:i + batch_size])).float().cpu() for i in range(0, len(images), batch_size)]
    model.train(was_training)
    return torch.cat(outs) if outs else torch.empty(0)


def accuracy_report(logits: torch.Tensor, labels: torch.Tensor, classes: Sequence[str]) -> dict[str, object]:
    """{'top1', 'mean_class_accuracy', 'n', 'per_class': {class: {'accuracy', 'n'}}} (classes with samples)."""
    pred = logits.argmax(1)
    correct = pred == labels
    per_class: dict[str, dict[str, float | int]] = {}
    for c, name in enumerate(classes):
        m = labels == c
        cnt = int(m.sum())
        if cnt:
            per_class[name] = {"accuracy": float(correct[m].float().mean()), "n": cnt}
    mca = sum(float(v["accuracy"]) for v in per_class.values()) / max(1, len(per_class))
    return {"top1": float(correct.float().mean()) if len(labels) else 0.0, "mean_class_accuracy": mca,
            "n": int(len(labels)), "per_class": per_class}


def evaluate(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, classes: Sequence[str],
             norm: Normalizer, batch_size: int = 256) -> dict[str, object]:
    return accuracy_report(predict(model, images, norm, batch_size), labels.cpu(), classes)

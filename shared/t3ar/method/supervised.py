"""Supervised fine-tuning (the user's source model f_S, and the speed baseline of a plain step)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from t3ar.method.adapt import AdaptResult, StepStats, place, prepare_training, stream
from t3ar.method.augment import Normalizer
from t3ar.method.schedule import Optimiser, epoch_batches, steps_per_epoch
from t3ar.method.views import Views
from t3ar.models.classifier import Classifier, configure_trainable, freeze_frozen_norms


class TrainConfig(BaseModel):
    """Source training: cross-entropy on weak views with label smoothing (as SHOT trains f_S)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    epochs: int = Field(default=15, ge=1, le=1000)
    batch_size: int = Field(default=32, ge=2)
    lr: float = Field(default=0.02, gt=0)
    momentum: float = 0.9
    weight_decay: float = 5e-4
    warmup_frac: float = Field(default=0.05, ge=0, lt=1)
    label_smoothing: float = Field(default=0.1, ge=0, lt=1)
    train_groups: int | None = Field(default=2, ge=0)
    seed: int = 0
    amp: bool = True


def train_supervised(model: Classifier, images: torch.Tensor, labels: torch.Tensor, config: TrainConfig, *,
                     mean: tuple[float, float, float], std: tuple[float, float, float],
                     device: torch.device, generator: torch.Generator | None = None,
                     on_step: Callable[[StepStats], None] | None = None) -> AdaptResult:
    """Fine-tune ``model`` in place: last ``train_groups`` backbone groups + bottleneck + head."""
    gen = generator or torch.Generator().manual_seed(config.seed)
    prepare_training(model, device)
    params = configure_trainable(model, config.train_groups, head=True)
    n = len(images)
    bs = min(config.batch_size, n)
    total = config.epochs * steps_per_epoch(n, bs)
    use_amp = device.type == "cuda" and config.amp
    optim = Optimiser(params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay,
                      total_steps=total, warmup_frac=config.warmup_frac, amp=use_amp)
    views = Views(Normalizer(mean, std, device), stream(config.seed, 1))
    images = place(images, device, float("inf"))
    labels = labels.to(device)
    result = AdaptResult()
    t_start = time.perf_counter()
    step = 0
    for epoch in range(1, config.epochs + 1):
        for idx in epoch_batches(n, bs, gen):
            model.train()
            freeze_frozen_norms(model)
            t0 = time.perf_counter()
            x = views.weak(images[idx.to(images.device)])
            t1 = time.perf_counter()
            with torch.autocast(device.type, enabled=use_amp):
                loss = F.cross_entropy(model(x).float(), labels[idx.to(device)],
                                       label_smoothing=config.label_smoothing)
            optim.update(loss)
            step += 1
            stats = StepStats(epoch, step, total, optim.lr, float(loss.detach()),
                              loss_ce=float(loss.detach()), seconds_augment=t1 - t0,
                              seconds_forward_backward=time.perf_counter() - t1)
            result.history.append(stats)
            if on_step is not None:
                on_step(stats)
    model.eval()
    result.steps, result.epochs = step, config.epochs
    result.seconds = time.perf_counter() - t_start
    result.seconds_per_epoch = result.seconds / config.epochs
    return result

"""Supervised fine-tuning (the user's source model f_S, and the speed baseline of a plain step)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from t3ar.method.adapt import AdaptResult, StepStats, folded_layers, place, prepare_training, scheduled, stream
from t3ar.method.ahead import Ahead
from t3ar.method.ahead import enabled as ahead_enabled
from t3ar.method.augment import Normalizer
from t3ar.method.config import ViewsAhead
from t3ar.method.schedule import Optimiser, steps_per_epoch
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
    views_ahead: ViewsAhead = None


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

    def prepare(item: tuple[int, torch.Tensor]) -> torch.Tensor:  # views ahead (t3ar.method.ahead)
        return views.weak(images[item[1].to(images.device)])

    t_start = mark = time.perf_counter()
    step = 0
    with folded_layers(model, device), \
            Ahead(scheduled(n, bs, total, gen), prepare, on=ahead_enabled(config.views_ahead, device)) as ahead:
        for (epoch, idx), x, seconds_views in ahead:
            model.train()
            freeze_frozen_norms(model)
            with torch.autocast(device.type, enabled=use_amp):
                loss = F.cross_entropy(model(x).float(), labels[idx.to(device)],
                                       label_smoothing=config.label_smoothing)
            optim.update(loss)
            step += 1
            value = float(loss.detach())
            ahead.settle()
            stats = StepStats(epoch, step, total, optim.lr, value, loss_ce=value, seconds_augment=seconds_views,
                              seconds_forward_backward=time.perf_counter() - mark - ahead.waited)
            result.history.append(stats)
            if on_step is not None:
                on_step(stats)
            mark = time.perf_counter()
    model.eval()
    result.steps, result.epochs = step, config.epochs
    result.seconds = time.perf_counter() - t_start
    result.seconds_per_epoch = result.seconds / config.epochs
    return result

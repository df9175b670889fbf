"""Learning-rate schedule, seeded epoch batching and the optimiser update every training loop shares."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn


def lr_lambda(total_steps: int, warmup_frac: float) -> Callable[[int], float]:
    """Multiplier for LambdaLR: linear warm-up over ``warmup_frac`` of the steps, then cosine decay to 0."""
    warm = int(total_steps * warmup_frac)

    def f(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        progress = (step - warm) / max(1, total_steps - warm)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return f


def epoch_batches(n: int, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
    """A seeded epoch of index batches; a trailing batch of 1 is dropped (BatchNorm needs 2)."""
    order = torch.randperm(n, generator=generator)
    out = [order[i:i + batch_size] for i in range(0, n, batch_size)]
    if len(out) > 1 and len(out[-1]) < 2:
        out.pop()
    return out


def steps_per_epoch(n: int, batch_size: int) -> int:
    full, rest = divmod(n, batch_size)
    return full + (1 if rest >= 2 or (rest and full == 0) else 0)


class Optimiser:
    """SGD with Nesterov momentum, the :func:`lr_lambda` schedule over ``total_steps`` and loss scaling when
    ``amp`` (CUDA mixed precision): the update the adaptation loop and supervised fine-tuning share."""

    def __init__(self, params: list[nn.Parameter], *, lr: float, momentum: float, weight_decay: float,
                 total_steps: int, warmup_frac: float, amp: bool) -> None:
        self.optim = torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=True)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.optim, lr_lambda(total_steps, warmup_frac))
        self.scaler = torch.amp.GradScaler("cuda", enabled=amp)

    @property
    def lr(self) -> float:
        """The learning rate of the next update."""
        return float(self.sched.get_last_lr()[0])

    def update(self, loss: torch.Tensor) -> None:
        """Backward of ``loss`` (scaled), one optimiser step, one schedule step."""
        self.optim.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optim)
        self.scaler.update()
        self.sched.step()

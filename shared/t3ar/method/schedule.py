"""Learning-rate schedule, seeded epoch batching and the optimiser update every training loop shares."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

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
    """A seeded epoch of index batches. A trailing batch of less than half a batch is folded into the batch
    before it, so no step trains on (and no BatchNorm layer counts into its running statistics) a tiny batch:
    194 images at batch 32 are 5 batches of 32 and one of 34, not 6 of 32 and one of 2."""
    order = torch.randperm(n, generator=generator)
    out = [order[i:i + batch_size] for i in range(0, n, batch_size)]
    if len(out) > 1 and (2 * len(out[-1]) < batch_size or len(out[-1]) < 2):
        tail = out.pop()
        out[-1] = torch.cat([out[-1], tail])
    return out



def scheduled(n: int, batch_size: int, total: int, gen: torch.Generator) -> Iterator[tuple[int, torch.Tensor]]:
    """(epoch, batch indices) of ``total`` steps: seeded epochs of ``n`` images (:func:`epoch_batches`), the last
    one cut short (an epoch is drawn only when its first batch is needed)."""
    step = epoch = 0
    while step < total:
        epoch += 1
        for idx in epoch_batches(n, batch_size, gen):
            if step >= total:
                return
            yield epoch, idx
            step += 1

def steps_per_epoch(n: int, batch_size: int) -> int:
    """How many batches :func:`epoch_batches` makes of ``n`` images."""
    full, rest = divmod(n, batch_size)
    if full == 0:
        return 1
    return full + (1 if 2 * rest >= batch_size and rest >= 2 else 0)


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

    def reset_state(self) -> None:
        """Forget the per-parameter state (momentum buffers), as at the start; the schedule goes on."""
        self.optim.state.clear()

    def update(self, loss: torch.Tensor) -> None:
        """Backward of ``loss`` (scaled), one optimiser step, one schedule step."""
        self.optim.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optim)
        self.scaler.update()
        self.sched.step()

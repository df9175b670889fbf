"""Learning-rate schedule and seeded epoch batching."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch


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

"""``bn-adapt`` (AdaBN, Li et al. 2016; "BN adapt" in the test-time adaptation literature): the target's own
BatchNorm statistics, no loss, no gradient.

Every BatchNorm layer of the groups that would train (``config.train_groups``, None = every layer; the
bottleneck's always) forgets its source statistics and takes the exact mean and variance of the target, as
the evaluation transform shows it: one pass over the target in batches, the running statistics the average of
the batches' weighted by their sizes (so the running mean of a layer fed the images directly is exactly their
mean, whatever the batching; the variance is the batches' mean variance, as in AdaBN). Nothing else changes.
Cheap (one no-gradient pass) and a legitimate product option; the benchmark reports every other method as its
paired difference to it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from t3ar.method.augment import Normalizer
from t3ar.method.schedule import epoch_batches
from t3ar.models.classifier import Classifier, configure_trainable, freeze_frozen_norms, iter_batchnorms

__all__ = ["adapted_norms", "bn_adapt"]


def adapted_norms(model: Classifier, train_groups: int | None) -> list[torch.nn.modules.batchnorm._BatchNorm]:
    """The BatchNorm layers ``bn-adapt`` re-estimates: those of the last ``train_groups`` backbone groups (None =
    all), the bottleneck's and the head's (the layers the T3AR family's loop keeps in training mode)."""
    configure_trainable(model, train_groups, head=True)
    model.train()
    freeze_frozen_norms(model)
    norms = [m for m in iter_batchnorms(model) if m.training]
    for p in model.parameters():
        p.requires_grad_(False)
    return norms


@torch.no_grad()
def bn_adapt(model: Classifier, target: torch.Tensor, *, train_groups: int | None, batch_size: int,
             norm: Normalizer, generator: torch.Generator,
             on_batch: Callable[[int, int], None] | None = None) -> int:
    """Replace the running statistics of :func:`adapted_norms` with the target's (uint8 [N,3,S,S]); returns the
    number of batches. ``on_batch(done, total)`` after each (progress; may raise to cancel). The model is left
    in eval mode; its parameters are untouched."""
    norms = adapted_norms(model, train_groups)
    saved = [(m, m.momentum) for m in norms]
    batches = epoch_batches(len(target), min(batch_size, len(target)), generator)
    try:
        for m in norms:
            m.reset_running_stats()
        seen = 0
        for i, idx in enumerate(batches):
            seen += len(idx)
            for m in norms:  # running <- (1 - w) running + w batch, w = this batch's share of the images so far
                m.momentum = len(idx) / seen
            x = norm(target[idx.to(target.device)].to(norm.device, non_blocking=True))
            model(x)
            if on_batch is not None:
                on_batch(i + 1, len(batches))
    finally:
        for m, momentum in saved:
            m.momentum = momentum
        model.eval()
    return len(batches)

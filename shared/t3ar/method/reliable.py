"""Entropy-based reliability, the pieces SAR and EATA share (pure torch): per-sample entropy, the reliable-sample
filter ``entropy < E0 = 0.4 ln C``, the normalisation layers' affine parameters they train, a forward that leaves
the BatchNorm running statistics alone, and EATA's Fisher anchor (its diagonal estimated on the target's own
pseudo-labels, and the penalty ``sum F (theta - theta0)^2``).

Every function here works on device tensors without a host sync: a filter is a mask, a mean over an empty
selection is 0 (with a gradient of zeros), never NaN.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from t3ar.method.schedule import epoch_batches
from t3ar.models.classifier import Classifier, backbone_groups

#: E0 = ENTROPY_SHARE * ln C: a sample is reliable when its prediction entropy is below it (SAR and EATA both use
#: 0.4 ln 1000 on ImageNet and 0.4 ln C elsewhere)
ENTROPY_SHARE = 0.4
#: the normalisation layers whose affine parameters SAR and EATA train (both papers: BatchNorm, GroupNorm, LayerNorm)
NORMS = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm)


def entropy_margin(num_classes: int, share: float = ENTROPY_SHARE) -> float:
    """E0 = ``share`` * ln C."""
    return share * math.log(num_classes)


def sample_entropy(logits: torch.Tensor) -> torch.Tensor:
    """[B] Shannon entropy of softmax(logits) per sample, in float32 (also under autocast)."""
    logp = logits.float().log_softmax(1)
    return -(logp.exp() * logp).sum(1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` [B] over ``mask`` [B]; 0 (still part of the graph, so every gradient is a zero) when
    nothing is selected."""
    m = mask.to(values.dtype)
    return (values * m).sum() / m.sum().clamp(min=1.0)


def norm_affine_params(model: Classifier, skip_top_groups: int = 0) -> list[nn.Parameter]:
    """Set ``requires_grad`` so that only the affine parameters of the normalisation layers (:data:`NORMS`) train
    and return them, in module order. ``skip_top_groups`` > 0 leaves out the last that many backbone groups and
    everything above them (the bottleneck's BatchNorm): SAR's "top layers" (ResNet's layer4, ViT's last blocks
    and final norm); ignored when the backbone has no more groups than that."""
    for p in model.parameters():
        p.requires_grad_(False)
    skipped: set[int] = set()
    groups = backbone_groups(model.backbone)
    top = skip_top_groups > 0 and len(groups) > skip_top_groups
    if top:
        skipped = {id(p) for g in groups[len(groups) - skip_top_groups:] for p in g}
        skipped |= {id(p) for m in (model.bottleneck, model.head) for p in m.parameters()}
    params: list[nn.Parameter] = []
    for m in model.modules():
        if not isinstance(m, NORMS):
            continue
        for p in (m.weight, m.bias):
            if isinstance(p, nn.Parameter) and id(p) not in skipped:
                p.requires_grad_(True)
                params.append(p)
    return params


@contextmanager
def running_stats_kept(model: nn.Module) -> Iterator[None]:
    """Within the block, BatchNorm layers in training mode normalise with their batch's statistics as usual but
    leave their running statistics (and batch count) as they are: an auxiliary forward of a batch already
    counted, or none of the job's steps."""
    saved = [(m, m.momentum, None if m.num_batches_tracked is None else m.num_batches_tracked.clone())
             for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training]
    for m, _, _ in saved:
        m.momentum = 0.0
    try:
        yield
    finally:
        for m, momentum, count in saved:
            m.momentum = momentum
            if count is not None and m.num_batches_tracked is not None:
                m.num_batches_tracked.copy_(count)


def fisher_diagonal(model: nn.Module, params: Sequence[nn.Parameter], images: torch.Tensor,
                    view: Callable[[torch.Tensor], torch.Tensor], *, batch_size: int, samples: int,
                    generator: torch.Generator) -> list[torch.Tensor]:
    """EATA's diagonal Fisher information of ``params`` on unlabelled ``images`` (uint8 [N,3,S,S]): up to
    ``samples`` of them (a seeded random subset), in seeded batches of ``batch_size`` (a tail of less than half a
    batch folded into the batch before, :func:`epoch_batches`), each pseudo-labelled with the model's own argmax;
    per batch the squared gradient of the batch's mean cross-entropy, averaged over the batches (as EATA does).

    ``view`` turns a uint8 batch into the model's input. The model's mode is the caller's (EATA: training mode,
    so BatchNorm uses the batch's statistics); the running statistics are left alone; float32 (no autocast);
    no parameter's ``.grad`` is touched."""
    n = min(len(images), samples)
    chosen = torch.randperm(len(images), generator=generator)[:n]
    batches = epoch_batches(n, min(batch_size, n), generator)
    fisher = [torch.zeros_like(p, dtype=torch.float32) for p in params]
    device = params[0].device
    with torch.autocast(device.type, enabled=False), running_stats_kept(model):
        for pos in batches:
            idx = chosen[pos]
            x = view(images[idx.to(images.device)])
            logits = model(x).float()
            loss = nn.functional.cross_entropy(logits, logits.detach().argmax(1))
            grads = torch.autograd.grad(loss, list(params), allow_unused=True)
            for f, g in zip(fisher, grads, strict=True):
                if g is not None:
                    f.add_(g.float().square())
    for f in fisher:
        f.div_(len(batches))
    return fisher


def fisher_penalty(params: Sequence[torch.Tensor], fisher: Sequence[torch.Tensor],
                   anchor: Sequence[torch.Tensor]) -> torch.Tensor:
    """sum_i F_i (theta_i - theta0_i)^2 over every parameter (a float32 scalar; 0 at the anchor)."""
    total = torch.zeros((), device=fisher[0].device)
    for p, f, p0 in zip(params, fisher, anchor, strict=True):
        total = total + (f * (p.float() - p0).square()).sum()
    return total

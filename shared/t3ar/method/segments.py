"""One forward pass over several batches at once, each normalised by its own BatchNorm statistics.

A T3AR step forwards the strong views of the target batch (the keys) and the retrieved pool images without
gradient. Done separately, each pass normalises with its own batch statistics; done as one concatenated
pass (fewer, larger kernels) plain BatchNorm would mix them. :func:`segmented_batch_stats` makes every
BatchNorm layer that is in training mode compute its statistics per segment, so one pass gives what the
separate passes give. Rows after the last segment are padding (to keep tensor shapes in a few buckets on
CUDA, where every new shape costs a cuDNN plan search): they never enter a statistic and their outputs are
to be discarded. Running statistics are not updated (these are auxiliary passes). Layers in eval mode are
untouched: they already treat every row on its own. Each layer's own forward runs per segment, so layers that fuse an
activation into their BatchNorm (timm's ``BatchNormAct2d``) keep it.

With ``first_trains=True`` the first segment is the step's trained batch (the T3AR family's joint pass on CUDA,
:mod:`t3ar.method.contrastive`): it is normalised, graded and counted into the running statistics exactly as a
plain training-mode forward of it alone would be; the other segments are computed without gradient, as above.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn


def _segmented(m: nn.modules.batchnorm._BatchNorm, forward: Callable[[torch.Tensor], torch.Tensor],
               x: torch.Tensor, segments: Sequence[int], first_trains: bool, momentum: float | None) -> torch.Tensor:
    """The layer's own forward on each segment (so subclasses that add an activation after the normalisation,
    like timm's ``BatchNormAct2d``, keep it); padding rows get a copy of the last output row.

    ``first_trains``: the first segment runs with the layer's own ``momentum``, updating the running statistics,
    and with gradient; the others with momentum 0 and without gradient."""
    outs: list[torch.Tensor] = []
    start = 0
    for i, n in enumerate(segments):
        if i == 0 and first_trains:
            m.momentum = momentum
            try:
                outs.append(forward(x[:n]))
            finally:
                m.momentum = 0.0
        else:
            with torch.no_grad():
                outs.append(forward(x[start:start + n]))
        start += n
    if start < len(x):  # padding: never read, never part of a statistic
        outs.append(outs[-1][:1].expand(len(x) - start, *outs[-1].shape[1:]))
    return torch.cat(outs) if len(outs) > 1 else outs[0]


@contextmanager
def segmented_batch_stats(model: nn.Module, segments: Sequence[int], *, first_trains: bool = False) -> Iterator[None]:
    """Within the block, training-mode BatchNorm layers of ``model`` use per-segment batch statistics.

    ``segments`` are the row counts of consecutive segments of the batch (each >= 2 rows for a meaningful
    variance); rows beyond their sum are padding. Running statistics are not updated (momentum 0 inside the
    block), and the block is meant for ``torch.no_grad()``; except, with ``first_trains``, for the first segment:
    it updates them with the layer's own momentum and carries gradient, as a plain forward of it would.
    """
    if any(n < 1 for n in segments):
        raise ValueError(f"segments must be positive row counts, got {list(segments)}")
    patched: list[tuple[nn.modules.batchnorm._BatchNorm, float | None]] = []
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training:
            own = m.forward  # the class's forward, bound (BatchNormAct2d's includes its activation)
            m.forward = (lambda x, m=m, f=own, mo=m.momentum:  # type: ignore[method-assign,misc]
                         _segmented(m, f, x, segments, first_trains, mo))
            patched.append((m, m.momentum))
            m.momentum = 0.0
    try:
        yield
    finally:
        for m, momentum in patched:
            del m.forward  # back to the class's forward
            m.momentum = momentum


def bucket(n: int, size: int) -> int:
    """``n`` rounded up to a multiple of ``size`` (1 = no padding)."""
    return -(-n // size) * size

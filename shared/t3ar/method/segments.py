"""One forward pass over several batches at once, each normalised by its own BatchNorm statistics.

A T3AR step forwards the strong views of the target batch (the keys) and the retrieved pool images without
gradient. Done separately, each pass normalises with its own batch statistics; done as one concatenated
pass (fewer, larger kernels) plain BatchNorm would mix them. :func:`segmented_batch_stats` makes every
BatchNorm layer that is in training mode compute its statistics per segment, so one pass gives what the
separate passes give. Rows after the last segment are padding (to keep tensor shapes in a few buckets on
CUDA, where every new shape costs a cuDNN plan search): they pass through unnormalised and never enter a
statistic; their outputs are to be discarded.
Running statistics are not updated (these are auxiliary passes). Layers in eval mode are untouched: they
already treat every row on its own.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn


def _segmented_bn(bn: nn.modules.batchnorm._BatchNorm, x: torch.Tensor, segments: Sequence[int]) -> torch.Tensor:
    outs: list[torch.Tensor] = []
    start = 0
    for n in segments:  # the native kernel per segment: batch statistics, running statistics untouched
        outs.append(F.batch_norm(x[start:start + n], None, None, bn.weight, bn.bias, True, 0.0, bn.eps))
        start += n
    if start < len(x):  # padding rows: their outputs are never read and never enter a statistic
        outs.append(x[start:])
    return torch.cat(outs) if len(outs) > 1 else outs[0]


@contextmanager
def segmented_batch_stats(model: nn.Module, segments: Sequence[int]) -> Iterator[None]:
    """Within the block, training-mode BatchNorm layers of ``model`` use per-segment batch statistics.

    ``segments`` are the row counts of consecutive segments of the batch (each >= 2 rows for a meaningful
    variance); rows beyond their sum are padding. Use under ``torch.no_grad()``.
    """
    if any(n < 1 for n in segments):
        raise ValueError(f"segments must be positive row counts, got {list(segments)}")
    patched: list[nn.Module] = []
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training:
            m.forward = (lambda x, bn=m: _segmented_bn(bn, x, segments))  # type: ignore[method-assign,misc]
            patched.append(m)
    try:
        yield
    finally:
        for m in patched:
            del m.forward  # back to the class's forward


def bucket(n: int, size: int) -> int:
    """``n`` rounded up to a multiple of ``size`` (1 = no padding)."""
    return -(-n // size) * size

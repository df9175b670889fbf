"""Frozen convolution + BatchNorm pairs computed as one convolution, with the normalisation folded into it.

When only the last backbone groups train (the default, ``train_groups=2``), every earlier BatchNorm layer is
frozen and in eval mode: it applies a fixed per-channel affine map to its convolution's output. Folding that
map into the convolution's weight and bias gives the same function with one kernel less per layer; only the
float rounding differs (1e-5 to 1e-4 relative at Lite0's features). Measured on the 2-core CPU
(EfficientNet-Lite0 at 64 px, batch 32, channels-last, calls alternated): the frozen part's forward 40.8 ->
31.7 ms, a supervised forward+backward 126 -> 116 ms, a no-gradient pass 58 -> 50 ms.

:func:`folded_frozen_norms` patches the pairs for the duration of a block (a training loop) and removes the
patches after; the model's parameters and state dict are never touched. A pair is folded only when the
convolution's output feeds the BatchNorm alone and each is called at one place (found by tracing the
backbone with :mod:`torch.fx`), and the BatchNorm is a plain ``BatchNorm2d`` or timm's ``BatchNormAct2d``
(whose activation is kept). Each call of the convolution checks that the pair is still frozen and in eval
mode and that no parameter or running statistic changed since it was folded (refolding then); otherwise the
two layers run as they are. A model that does not trace is left as it is. :func:`fold_inplace` folds a
network that is only ever evaluated (the retriever's embedder) for good.
"""

from __future__ import annotations

import copy
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.fx
from torch import nn

log = logging.getLogger(__name__)

__all__ = ["FOLD", "fold_inplace", "folded_frozen_norms", "frozen_pairs"]

#: Per device type: fold frozen pairs in the training loops. On CUDA a step of our small models is bound by
#: Python launching kernels, and the fold trades one BatchNorm launch per pair for two small checks in Python:
#: on the CPU with a forward that small (2 images of 8 px, dispatch only) it costs 12.03 -> 12.28 ms; its CUDA
#: figures are not measured, so it stays off there until they are. An entry may be switched for an experiment.
FOLD: dict[str, bool] = {"cpu": True, "cuda": False}


class _Tracer(torch.fx.Tracer):
    """Convolutions and BatchNorm layers as leaves (timm's subclasses too), whatever module defines them."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, (nn.Conv2d, nn.modules.batchnorm._BatchNorm)) or super().is_leaf_module(
            m, module_qualified_name)


def _post_norm(bn: nn.Module) -> nn.Module | None:
    """What ``bn`` does after normalising, as a module (plain BatchNorm2d: nothing; timm's BatchNormAct2d: its
    drop, then its activation), or None for a class whose forward is not known."""
    if type(bn) is nn.BatchNorm2d:
        return nn.Identity()
    try:
        from timm.layers import BatchNormAct2d
    except ImportError:  # pragma: no cover - timm is a dependency
        return None
    if type(bn) is BatchNormAct2d:
        return nn.Sequential(bn.drop, bn.act)
    return None


def _folded(conv: nn.Conv2d, bn: nn.modules.batchnorm._BatchNorm) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, bias) of the convolution with the BatchNorm's eval-mode affine map folded in; the weight in
    the convolution's memory format."""
    mean, var = bn.running_mean, bn.running_var
    if mean is None or var is None:  # frozen_pairs takes only layers with running statistics
        raise ValueError("a BatchNorm without running statistics cannot be folded")
    with torch.no_grad():
        scale = var.float().add(bn.eps).rsqrt()
        if bn.weight is not None:
            scale = scale * bn.weight.float()
        shift = -mean.float() * scale
        if bn.bias is not None:
            shift = shift + bn.bias.float()
        if conv.bias is not None:
            shift = shift + conv.bias.float() * scale
        weight = torch.empty_like(conv.weight)  # keeps the weight's memory format (channels-last on the CPU)
        weight.copy_(conv.weight.float() * scale.view(-1, *([1] * (conv.weight.dim() - 1))))
    return weight, shift.to(conv.weight.dtype)


def fold_inplace(module: nn.Module) -> int:
    """Fold ``module``'s pairs for good, for a network that is only ever evaluated (the retriever's
    embedder): each convolution takes the folded weight and bias and its BatchNorm (in eval mode) is replaced
    by what it does after normalising. No per-call check and no patch: the module is simply smaller. Returns
    the number of pairs folded."""
    names = {id(m): n for n, m in module.named_modules()}
    n = 0
    for conv, bn in frozen_pairs(module):
        post = _post_norm(bn)
        if bn.training or post is None:
            continue
        weight, bias = _folded(conv, bn)
        conv.weight = nn.Parameter(weight, requires_grad=False)
        conv.bias = nn.Parameter(bias, requires_grad=False)
        parent_name, _, attr = names[id(bn)].rpartition(".")
        setattr(module.get_submodule(parent_name), attr, post)
        n += 1
    return n


def _frozen(*modules: nn.Module) -> bool:
    return not any(p.requires_grad for m in modules for p in m.parameters(recurse=False))


def frozen_pairs(module: nn.Module) -> list[tuple[nn.Conv2d, nn.modules.batchnorm._BatchNorm]]:
    """(convolution, BatchNorm) pairs of ``module`` that can be folded: the convolution's output goes to the
    BatchNorm only, each of the two is called at one place in the forward, both are frozen (no parameter
    requires a gradient) and the BatchNorm keeps running statistics (it folds at the calls where it is in eval
    mode). Empty when ``module`` has no such pair or does not trace."""
    if not any(isinstance(m, nn.modules.batchnorm._BatchNorm) and _frozen(m) for m in module.modules()):
        return []
    try:
        graph = _Tracer().trace(module)
    except Exception as exc:  # noqa: BLE001 - fx raises many types on untraceable Python
        log.debug("not folding BatchNorm into convolutions: %s does not trace (%s)", type(module).__name__, exc)
        return []
    modules = dict(module.named_modules())
    calls = Counter(str(n.target) for n in graph.nodes if n.op == "call_module")
    pairs = []
    for node in graph.nodes:
        if node.op != "call_module" or not node.args:
            continue
        bn, src = modules.get(str(node.target)), node.args[0]
        if not (isinstance(bn, nn.modules.batchnorm._BatchNorm) and isinstance(src, torch.fx.Node)
                and src.op == "call_module" and len(src.users) == 1):
            continue
        conv = modules.get(str(src.target))
        if calls[str(src.target)] != 1 or calls[str(node.target)] != 1:  # a layer used twice: left as it is
            continue
        if (isinstance(conv, nn.Conv2d) and bn.track_running_stats
                and bn.running_mean is not None and _post_norm(bn) is not None and _frozen(conv, bn)):
            pairs.append((conv, bn))
    return pairs


class _Folded:
    """One pair's folded convolution, and the versions of every tensor it was computed from."""

    def __init__(self, conv: nn.Conv2d, bn: nn.modules.batchnorm._BatchNorm) -> None:
        self.conv, self.bn = conv, bn
        self.active = False  # the convolution's last call ran folded, and its BatchNorm has not run since
        self.post = _post_norm(bn)
        self.shadow = copy.copy(conv)  # the same layer (stride, padding, ...) with the folded parameters
        self._fold()

    def _fold(self) -> None:
        weight, bias = _folded(self.conv, self.bn)
        self.shadow._parameters = {"weight": nn.Parameter(weight, requires_grad=False),
                                   "bias": nn.Parameter(bias, requires_grad=False)}
        self.stamp = self._stamp()

    def usable(self) -> bool:
        """Still frozen, in eval mode, and folded from the current values (refolded when one changed)."""
        if self.bn.training:
            return False
        stamp = self._stamp()
        if stamp is None:
            return False
        if stamp != self.stamp:
            self._fold()
        return True

    def _stamp(self) -> list[tuple[int, int]] | None:
        """Which tensors the pair holds and their in-place versions (any change to them changes this), or None
        when one of them requires a gradient (it trains now)."""
        conv, bn = self.conv, self.bn
        out = []
        for t in (conv.weight, conv.bias, bn.weight, bn.bias, bn.running_mean, bn.running_var):
            if t is not None:
                if t.requires_grad:
                    return None
                out.append((id(t), t._version))
        return out


@contextmanager
def folded_frozen_norms(model: nn.Module, enabled: bool = True) -> Iterator[int]:
    """Within the block, each of ``model``'s foldable pairs (:func:`frozen_pairs`, found on entry) runs as one
    convolution with the BatchNorm folded in. Yields the number of pairs folded (0 when ``enabled`` is
    false). Entering traces the model (~25 ms for Lite0): enter once per training loop, not per call. Copy
    the model before the block, not inside it (a copy would share the patched layers' forwards). One forward
    at a time through the model (a training loop's): each pair's convolution tells its BatchNorm whether it
    ran folded. A network that never trains again is better folded for good (:func:`fold_inplace`)."""
    pairs = frozen_pairs(model) if enabled else []
    patched: list[tuple[nn.Module, Any]] = []
    try:
        for conv, bn in pairs:
            f = _Folded(conv, bn)
            conv_own, bn_own = conv.forward, bn.forward

            def conv_forward(x: torch.Tensor, f: _Folded = f, own: Callable[..., Any] = conv_own) -> Any:
                f.active = f.usable()
                return type(f.conv).forward(f.shadow, x) if f.active else own(x)

            def bn_forward(x: torch.Tensor, f: _Folded = f, own: Callable[..., Any] = bn_own) -> Any:
                # the BatchNorm's one call site takes the convolution's output: folded when that call was
                active, f.active = f.active, False
                return f.post(x) if active and f.post is not None else own(x)

            for m, fn in ((conv, conv_forward), (bn, bn_forward)):
                patched.append((m, m.__dict__.get("forward")))
                m.forward = fn  # type: ignore[method-assign,assignment]
        yield len(pairs)
    finally:
        for m, before in reversed(patched):
            if before is None:
                del m.forward
            else:
                m.forward = before

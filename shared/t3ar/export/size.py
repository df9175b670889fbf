"""How much memory an export takes before it runs, so a server can refuse one that would not fit.

An export holds the checkpoint's weights several times at once (the loaded payload, the reference classifier, the
inference classifier, the serialised graph or safetensors bytes, and what onnxruntime or the read-back loads from
them: :data:`WEIGHT_COPIES`), its parity images twice (uint8 NCHW and the NHWC copy onnxruntime is fed), and the
activations of one chunk of images (:data:`t3ar.export.parity.CHUNK`; the trace of the ONNX export runs a batch of
2) in torch and again in onnxruntime.

The activations are measured, not guessed per architecture: the classifier is built on torch's ``meta`` device (no
memory, no weights) and run on one image of the checkpoint's size while every operation's output is watched; a
forward pass keeps a few tensors of the largest one's size alive at once (:data:`ACTIVATION_FACTOR`, from ``ru_maxrss``
of real CPU passes of MobileNetV2 and EfficientNet-Lite0 at 384-512 px: 3.0-3.5).
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from t3ar.models.classifier import ModelSpec, build_classifier

#: copies of the weights an export holds at its peak (see the module)
WEIGHT_COPIES = 6
#: live activation bytes of a forward pass per byte of its largest single tensor (see the module)
ACTIVATION_FACTOR = 4
#: the ONNX exporter traces the model on a batch of this many images
TRACE_BATCH = 2


class _LargestOutput(TorchDispatchMode):
    """Records the largest tensor any operation returns."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel() * t.element_size())
        return out


def model_footprint(spec: ModelSpec) -> tuple[int, int]:
    """``(weight bytes, largest activation bytes of one image)`` of ``spec``'s classifier at its image size,
    measured on the ``meta`` device (nothing allocated)."""
    plain = spec.model_copy(update={"backbone": spec.backbone.without_weights()})
    try:
        with torch.device("meta"):
            model = build_classifier(plain)
    except Exception:  # a builder that copies tensors between devices (open_clip): on the CPU, then dropped
        model = build_classifier(plain)
    model = model.to_empty(device="meta").eval()
    weights = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    watch = _LargestOutput()
    size = spec.image_size
    with torch.no_grad(), watch:
        model(torch.empty((1, 3, size, size), device="meta"))
    return weights, watch.largest


def export_memory_bytes(spec: ModelSpec, n_images: int, chunk: int | None = None) -> int:
    """Bytes an export of a ``spec`` checkpoint checked on ``n_images`` parity images holds at its peak (see the
    module); ``chunk``: images per forward pass (default :data:`t3ar.export.parity.CHUNK`)."""
    from t3ar.export.parity import CHUNK

    weights, largest = model_footprint(spec)
    per_image = ACTIVATION_FACTOR * largest
    batch = max(chunk or CHUNK, TRACE_BATCH)
    images = 2 * n_images * 3 * spec.image_size**2
    return WEIGHT_COPIES * weights + images + 2 * batch * per_image

"""The check an export must pass before it is written: the exported model's logits against the checkpoint's.

The reference is the classifier as t3ar loads it from the checkpoint, in eval mode, on the CPU, fed the way t3ar
evaluates (uint8 -> :class:`t3ar.method.augment.Normalizer`). ONNX runs in onnxruntime on the CPU, first on one
image, then on chunks of :data:`CHUNK`, so the dynamic batch dimension is exercised too. Both run the images in
chunks of :data:`CHUNK`: the memory of a check is that of one chunk's activations, whatever the image count
(:mod:`t3ar.export.size` estimates it). A safetensors file is
loaded back through :func:`t3ar.models.checkpoint.load_checkpoint`'s reader and must hold every tensor bit for bit.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from t3ar.errors import ExportError
from t3ar.method.augment import Normalizer
from t3ar.models.classifier import Classifier, ModelSpec

#: Largest |logit difference| an export may show (the issue's contract); float rounding of a fused graph is
#: ~1e-6 on Lite0, so this only catches a wrong graph.
TOLERANCE = 1e-3
#: images per forward pass of a parity check (the result does not depend on it; the peak memory does)
CHUNK = 4


def _chunks(n: int, first: int | None = None) -> list[slice]:
    """Slices of ``range(n)`` of :data:`CHUNK` images (after one of ``first`` images when given)."""
    start = min(first, n) if first else 0
    head = [slice(0, start)] if start else []
    return head + [slice(i, min(i + CHUNK, n)) for i in range(start, n, CHUNK)]


@dataclass(frozen=True)
class Parity:
    """How closely the exported model reproduces the checkpoint on ``images`` images."""

    images: int
    images_source: str
    max_abs_diff: float
    top1_agreement: float  # the share of images whose top-1 class is the same (1.0 = every one)
    tolerance: float = TOLERANCE

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= self.tolerance and self.top1_agreement == 1.0

    def line(self) -> str:
        same = round(self.top1_agreement * self.images)
        return (f"parity on {self.images_source}: max |logit diff| {self.max_abs_diff:.2e} (limit "
                f"{self.tolerance:.0e}), top-1 agreement {same}/{self.images}")

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


class ParityError(ExportError):
    """The exported model does not reproduce the checkpoint's logits; ``parity`` holds the figures."""

    def __init__(self, fmt: str, parity: Parity) -> None:
        super().__init__(f"the {fmt} export does not reproduce the checkpoint ({parity.line()}); nothing was "
                         "written")
        self.parity = parity


def reference_logits(model: Classifier, spec: ModelSpec, images: torch.Tensor) -> np.ndarray:
    """The checkpoint's logits on uint8 ``images [n, 3, s, s]``: eval mode, CPU, float32, as t3ar evaluates."""
    model = model.cpu().eval()
    norm = Normalizer(spec.backbone.mean, spec.backbone.std, torch.device("cpu"))
    parts: list[np.ndarray] = []
    with torch.no_grad():
        for part in _chunks(len(images)):
            parts.append(model(norm(images[part])).float().numpy())
    return np.concatenate(parts) if parts else np.empty((0, spec.num_classes), dtype=np.float32)


def compare(reference: np.ndarray, exported: np.ndarray, source: str) -> Parity:
    """The figures of two logit arrays of the same images."""
    if reference.shape != exported.shape:
        raise ExportError(f"the exported model answers shape {exported.shape}, the checkpoint {reference.shape}")
    diff = float(np.max(np.abs(reference - exported))) if reference.size else 0.0
    if not np.isfinite(diff):
        diff = float("inf")
    agree = float(np.mean(reference.argmax(1) == exported.argmax(1))) if len(reference) else 1.0
    return Parity(len(reference), source, diff, agree)


def onnx_logits(data: bytes, images: torch.Tensor) -> np.ndarray:
    """onnxruntime's logits for uint8 ``images [n, 3, s, s]`` (fed as the graph takes them: NHWC), batch 1 then
    chunks of :data:`CHUNK`."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, torch.get_num_threads())  # the caller's thread budget (a worker's, the API's)
    opts.log_severity_level = 3
    session = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    nhwc = images.permute(0, 2, 3, 1).contiguous().numpy()
    name = session.get_inputs()[0].name
    parts = [session.run(None, {name: nhwc[part]})[0] for part in _chunks(len(nhwc), first=1)]
    return np.concatenate(parts).astype(np.float32)

"""The ONNX graph of a t3ar classifier: what inference runs, with its preprocessing inside.

Input ``images``: ``uint8 [batch, image_size, image_size, 3]``, RGB, the image already resized (shorter side to
``image_size``, bicubic) and centre-cropped, as :func:`t3ar.data.images.resize_center_crop` does. Output
``logits``: ``float32 [batch, num_classes]`` in the order of the ``t3ar.classes`` metadata. The graph converts to
float, scales to [0, 1] and normalises with the checkpoint's mean and std, then runs backbone, bottleneck and head.

Why uint8 NHWC and not float NCHW: it is what an image decoder hands over (Pillow's ``np.asarray(img)``,
OpenCV after BGR->RGB, a JPEG decoded by Triton's or DALI's image ops), a quarter of the bytes over the wire of a
serving endpoint, and a client cannot get the normalisation wrong: mean, std and the /255 live in the graph, the
same numbers t3ar trained with. Only the resize stays outside (images of any size cannot share a batch).

What inference runs, not what training runs: the model is rebuilt from its state dict (no folded-norm patches of
:mod:`t3ar.models.fold` or other forward hooks of a training loop ride along), put in eval mode (BatchNorm uses
its running statistics) and the weight-normalised head becomes a plain ``Linear`` holding ``g * v / |v|``.
"""

from __future__ import annotations

import hashlib
import io
import json
from typing import Any

import torch
from torch import nn

from t3ar import __version__
from t3ar.errors import ExportError, MissingDependencyError
from t3ar.models.checkpoint import CheckpointInfo
from t3ar.models.classifier import Classifier, ModelSpec, build_classifier

INPUT, OUTPUT = "images", "logits"
#: Opset 17: read by every onnxruntime since 1.14 (and Triton's ONNX Runtime backend of the same age); nothing
#: newer is needed by a convolutional or ViT classifier.
OPSET = 17
INPUT_DOC = ("images: uint8 [batch, {size}, {size}, 3], RGB, resized (shorter side to {size}, bicubic) and "
             "centre-cropped; scaling to [0, 1] and normalisation (mean, std) are inside the graph")
OUTPUT_DOC = "logits: float32 [batch, {n}], columns in the order of t3ar.classes"


def require_onnx() -> None:
    """Raise MissingDependencyError unless ``onnx`` and ``onnxruntime`` import."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as exc:
        raise MissingDependencyError(
            f"ONNX export needs the packages onnx and onnxruntime ({exc}): pip install 't3ar[export]'") from exc


class ServingModel(nn.Module):
    """uint8 NHWC images -> logits: the preprocessing of :class:`t3ar.method.augment.Normalizer` folded into one
    multiply-add per channel (``x * 1/(255 std) - mean/std``), then the classifier."""

    scale: torch.Tensor
    shift: torch.Tensor

    def __init__(self, classifier: nn.Module, mean: tuple[float, float, float], std: tuple[float, float, float]):
        super().__init__()
        self.classifier = classifier
        std_t, mean_t = torch.tensor(std, dtype=torch.float32), torch.tensor(mean, dtype=torch.float32)
        self.register_buffer("scale", (1.0 / (255.0 * std_t)).view(1, 3, 1, 1))
        self.register_buffer("shift", (mean_t / std_t).view(1, 3, 1, 1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images.permute(0, 3, 1, 2).float()
        out: torch.Tensor = self.classifier(x * self.scale - self.shift)
        return out


def inference_classifier(spec: ModelSpec, state_dict: dict[str, torch.Tensor]) -> Classifier:
    """A fresh classifier with ``state_dict`` loaded, in eval mode, its head a plain ``Linear`` (weight norm
    evaluated once): the function t3ar's evaluation computes, without training-time wrappers."""
    model = build_classifier(spec.model_copy(update={"backbone": spec.backbone.without_weights()}))
    model.load_state_dict(state_dict, strict=True)
    head = model.head
    if not isinstance(head, nn.Linear):  # pragma: no cover - build_classifier makes Linear heads only
        raise ExportError(f"cannot export a head of type {type(head).__name__}")
    plain = nn.Linear(head.in_features, head.out_features, bias=head.bias is not None)
    with torch.no_grad():
        plain.weight.copy_(head.weight)  # a parametrised head computes g * v / |v| here
        if head.bias is not None and plain.bias is not None:
            plain.bias.copy_(head.bias)
    model.head = plain
    return model.eval()


def lineage_digest(info: CheckpointInfo) -> str:
    """sha256 of the lineage as canonical JSON (sorted keys): one value that names where the model came from."""
    text = json.dumps(info.lineage.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def metadata(info: CheckpointInfo) -> dict[str, str]:
    """The ``metadata_props`` of the exported model (all strings; lists and objects as JSON); ``t3ar.acceptance``
    when the checkpoint came from a job with a holdout (its acceptance record)."""
    spec, lineage = info.spec, info.lineage
    acceptance = info.metrics.get("acceptance")  # a job with a holdout: its candidates and winner
    return ({"t3ar.acceptance": json.dumps(acceptance, sort_keys=True)} if acceptance is not None else {}) | {
        "t3ar.format": "t3ar.onnx/1",
        "t3ar.input": INPUT_DOC.format(size=spec.image_size),
        "t3ar.output": OUTPUT_DOC.format(n=spec.num_classes),
        "t3ar.classes": json.dumps(list(spec.classes)),
        "t3ar.image_size": str(spec.image_size),
        "t3ar.mean": json.dumps(list(spec.backbone.mean)),
        "t3ar.std": json.dumps(list(spec.backbone.std)),
        "t3ar.spec": spec.model_dump_json(),
        "t3ar.base_model_sha256": lineage.base_model_sha256 or "",
        "t3ar.target_sha256": lineage.target_sha256 or "",
        "t3ar.lineage_sha256": lineage_digest(info),
        "t3ar.lineage": lineage.model_dump_json(),
        "t3ar.checkpoint_sha256": info.sha256,
        "t3ar.adapt_config": json.dumps(info.adapt_config, sort_keys=True),
        "t3ar.version": __version__,
    }


def onnx_bytes(model: Classifier, info: CheckpointInfo) -> bytes:
    """The serialised ONNX model of ``ServingModel(model)`` with :func:`metadata`, the batch dimension dynamic.

    Exported with the TorchScript-based exporter (``dynamo=False``): it needs only ``torch`` and ``onnx``, while
    the default ``torch.export`` path of torch >= 2.9 also needs ``onnxscript`` and ``onnx-ir``; measured on
    Lite0 at 32 px on the 2 shared cores here, 5 s against 42 s for the same parity (max |diff| 3e-7 both).
    It is deprecated upstream but present in every torch this project allows (< 2.15); the day it goes, the
    switch is ``dynamo=True`` with ``dynamic_shapes`` and those two packages.
    """
    require_onnx()
    import onnx

    spec = info.spec
    serving = ServingModel(model, spec.backbone.mean, spec.backbone.std).eval()
    # batch 2: a traced batch of 1 could be specialised into the graph as a constant
    example = torch.zeros((2, spec.image_size, spec.image_size, 3), dtype=torch.uint8)
    buf = io.BytesIO()
    try:
        with torch.no_grad():
            # the TorchScript exporter writes to a file object too (its annotation names paths only)
            torch.onnx.export(serving, (example,), buf, dynamo=False,  # type: ignore[arg-type]
                              input_names=[INPUT], output_names=[OUTPUT],
                              dynamic_axes={INPUT: {0: "batch"}, OUTPUT: {0: "batch"}}, opset_version=OPSET)
    except Exception as exc:  # the tracer raises many types for modules it cannot express
        raise ExportError(f"the model cannot be exported to ONNX: {type(exc).__name__}: {exc}") from exc
    try:
        proto: Any = onnx.load_from_string(buf.getvalue())
        proto.producer_name, proto.producer_version = "t3ar", __version__
        proto.doc_string = (f"t3ar classifier {spec.arch_signature()}; " + INPUT_DOC.format(size=spec.image_size)
                            + "; " + OUTPUT_DOC.format(n=spec.num_classes))
        onnx.helper.set_model_props(proto, metadata(info))
        onnx.checker.check_model(proto)
        data: bytes = proto.SerializeToString()
    except (ValueError, RuntimeError, onnx.checker.ValidationError) as exc:  # e.g. over protobuf's 2 GB
        raise ExportError(f"the ONNX model cannot be written as one file: {type(exc).__name__}: {exc}") from exc
    return data

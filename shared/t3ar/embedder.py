"""The retriever R: a fixed image embedder ``images -> float32 [N, d]``, L2-normalised.

Backends: the packaged ImageNet EfficientNet-Lite0 (offline default; pooled 1280-d features; Lite1 and Lite2
are packaged too, same width) or any backbone spec (open_clip CLIP image towers by name/tag or local file,
timm from a local file).
Its ``identity`` (backend, name, weights hash, input size) lets a pool refuse vectors made by another R.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from pydantic import BaseModel, ConfigDict, Field

from t3ar.data.images import to_tensor_uint8
from t3ar.models.backbones import PRESETS, BackboneSpec, build_backbone, parse_backbone, weights_sha256
from t3ar.models.fold import fold_inplace

log = logging.getLogger(__name__)


class EmbedderSpec(BaseModel):
    """Which network embeds the pool and the queries, at which input size."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backbone: BackboneSpec = PRESETS["efficientnet_lite0"]
    image_size: int = Field(default=96, ge=16, le=1024)

    @classmethod
    def parse(cls, arch: str = "efficientnet_lite0", *, weights_path: str | None = None,
              pretrained_tag: str | None = None, image_size: int = 96) -> EmbedderSpec:
        return cls(backbone=parse_backbone(arch, weights_path=weights_path, pretrained_tag=pretrained_tag),
                   image_size=image_size)


class Embedder:
    """Batched, device-aware, deterministic (eval mode, centre crop, no augmentation)."""

    def __init__(self, spec: EmbedderSpec, device: torch.device | str = "cpu") -> None:
        self.spec = spec
        self.device = torch.device(device)
        self.net = build_backbone(spec.backbone).eval().to(self.device)
        for p in self.net.parameters():
            p.requires_grad_(False)
        # Measured on the 2-core CPU (Lite0, 128 images at 96 px): 547 ms per batch as it was, 391 ms
        # channels-last (oneDNN's fast layout), 321 ms with every BatchNorm also folded into its convolution;
        # the vectors move by at most ~1e-6 (unit norm). CUDA keeps channels-first (the layout measured faster
        # there for training under AMP); the fold only removes kernels there, but its CUDA speed is unmeasured.
        self._layout = torch.channels_last if self.device.type == "cpu" else torch.contiguous_format
        self.net.to(memory_format=self._layout)
        folded = fold_inplace(self.net)
        self.dim = int(getattr(self.net, "num_features"))  # noqa: B009
        b = spec.backbone
        self.identity = f"{b.kind}:{b.name}:{weights_sha256(b)[:16]}:{spec.image_size}px"
        self._mean = torch.tensor(b.mean, device=self.device).view(1, 3, 1, 1)
        self._std = torch.tensor(b.std, device=self.device).view(1, 3, 1, 1)
        log.info("embedder %s ready on %s (dim %d; %d BatchNorm layers folded into their convolutions)",
                 self.identity, self.device, self.dim, folded)

    def _prepare(self, images: Sequence[Image.Image] | torch.Tensor) -> torch.Tensor:
        if isinstance(images, torch.Tensor):
            if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] != 3:
                raise ValueError("tensor input must be uint8 [N, 3, H, W]")
            x = images
            if x.shape[-1] != self.spec.image_size or x.shape[-2] != self.spec.image_size:
                x = torch.stack([_resize_crop(img, self.spec.image_size) for img in x])
            return x
        return torch.stack([to_tensor_uint8(img, self.spec.image_size) for img in images]) if images else \
            torch.empty(0, 3, self.spec.image_size, self.spec.image_size, dtype=torch.uint8)

    @torch.inference_mode()
    def embed(self, images: Sequence[Image.Image] | torch.Tensor, batch_size: int = 128) -> np.ndarray:
        """Embed images (PIL RGB images or a uint8 [N,3,H,W] tensor) into float32 [N, dim], unit norm."""
        x = self._prepare(images)
        out = np.empty((len(x), self.dim), dtype=np.float32)
        for start in range(0, len(x), batch_size):
            batch = x[start:start + batch_size].to(self.device, non_blocking=True).float().div_(255)
            batch = ((batch - self._mean) / self._std).contiguous(memory_format=self._layout)
            with torch.autocast(self.device.type, enabled=self.device.type == "cuda"):
                feats = self.net(batch)
            out[start:start + len(batch)] = F.normalize(feats.float(), dim=1).cpu().numpy()
        return out


def _resize_crop(img: torch.Tensor, size: int) -> torch.Tensor:
    """Shorter side to ``size`` then centre crop, on a uint8 [3,H,W] tensor (same contract as the PIL path)."""
    h, w = img.shape[-2:]
    scale = size / min(h, w)
    nh, nw = max(size, round(h * scale)), max(size, round(w * scale))
    resized = F.interpolate(img[None].float(), size=(nh, nw), mode="bicubic", antialias=True, align_corners=False)
    top, left = (nh - size) // 2, (nw - size) // 2
    out = resized[0, :, top:top + size, left:left + size]
    return out.round().clamp_(0, 255).to(torch.uint8)

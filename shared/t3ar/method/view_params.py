"""What a batch of views draws: torchvision's parameter distributions, sampled per image into tensors.

Weak view: ``RandomResizedCrop(scale 0.6-1)`` + flip. Strong view: ``RandomResizedCrop(0.2-1)`` + flip +
``ColorJitter(0.4, 0.4, 0.4, 0.1)`` with p = 0.8 in a random order + ``RandomGrayscale(p=0.2)`` +
``RandAugment(num_ops=2, magnitude=9)``. The images themselves are transformed by :mod:`t3ar.method.view_ops`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

RATIO = (3.0 / 4.0, 4.0 / 3.0)
JITTER = (0.4, 0.4, 0.4, 0.1)  # brightness, contrast, saturation, hue
JITTER_P, GRAY_P = 0.8, 0.2
RA_OPS: tuple[str, ...] = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness",
                           "Color", "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize")
RA_NUM_OPS, RA_MAGNITUDE, RA_BINS = 2, 9, 31


@dataclass(frozen=True)
class ViewSpec:
    """What one kind of view draws: crop scale range, and whether the strong (colour + RandAugment) part runs."""

    scale: tuple[float, float]
    strong: bool


WEAK = ViewSpec(scale=(0.6, 1.0), strong=False)
STRONG = ViewSpec(scale=(0.2, 1.0), strong=True)


@dataclass
class ViewParams:
    """Every random draw of one batch of views (CPU tensors, one row per image)."""

    boxes: torch.Tensor  # [B, 4] float: top, left, height, width of the crop, in pixels
    flip: torch.Tensor  # [B] bool
    jitter: torch.Tensor  # [B] bool: colour jitter applied
    jitter_order: torch.Tensor  # [B, 4] long: a permutation of (brightness, contrast, saturation, hue)
    jitter_factors: torch.Tensor  # [B, 4] float: brightness, contrast, saturation factors, hue shift
    gray: torch.Tensor  # [B] bool
    ra_ops: torch.Tensor  # [B, RA_NUM_OPS] long: indices into RA_OPS
    ra_negative: torch.Tensor  # [B, RA_NUM_OPS] bool: signed ops take the negative magnitude


def cat_params(a: ViewParams, b: ViewParams) -> ViewParams:
    """The parameters of two batches, one after the other."""
    return ViewParams(**{f: torch.cat([getattr(a, f), getattr(b, f)]) for f in ViewParams.__dataclass_fields__})


def _crop_boxes(n: int, size: int, scale: tuple[float, float], gen: torch.Generator) -> torch.Tensor:
    """torchvision's ``RandomResizedCrop.get_params`` for n square images of side ``size``, vectorised:
    up to 10 tries of (area, log-ratio) per image, the first that fits wins, else the whole image."""
    area = float(size * size)
    tries = 10
    a = area * (scale[0] + (scale[1] - scale[0]) * torch.rand(n, tries, generator=gen))
    log_r = math.log(RATIO[0]) + (math.log(RATIO[1]) - math.log(RATIO[0])) * torch.rand(n, tries, generator=gen)
    r = torch.exp(log_r)
    w = torch.sqrt(a * r).round()
    h = torch.sqrt(a / r).round()
    ok = (w > 0) & (w <= size) & (h > 0) & (h <= size)
    first = torch.where(ok.any(1), ok.float().argmax(1), torch.full((n,), -1))
    rows = torch.arange(n)
    w_sel = torch.where(first >= 0, w[rows, first.clamp(min=0)], torch.full((n,), float(size)))
    h_sel = torch.where(first >= 0, h[rows, first.clamp(min=0)], torch.full((n,), float(size)))
    u = torch.rand(n, 2, generator=gen)
    top = torch.floor(u[:, 0] * (size - h_sel + 1))
    left = torch.floor(u[:, 1] * (size - w_sel + 1))
    return torch.stack([top, left, h_sel, w_sel], dim=1)


def sample_params(n: int, size: int, spec: ViewSpec, gen: torch.Generator) -> ViewParams:
    """Draw the parameters of ``n`` views of square images of side ``size`` (independently per image)."""
    boxes = _crop_boxes(n, size, spec.scale, gen)
    flip = torch.rand(n, generator=gen) < 0.5
    if not spec.strong:
        empty = torch.zeros(n, dtype=torch.bool)
        return ViewParams(boxes, flip, empty, torch.zeros(n, 4, dtype=torch.long), torch.zeros(n, 4), empty,
                          torch.zeros(n, 0, dtype=torch.long), torch.zeros(n, 0, dtype=torch.bool))
    jitter = torch.rand(n, generator=gen) < JITTER_P
    order = torch.rand(n, 4, generator=gen).argsort(dim=1)
    b, c, s, h = JITTER
    u = torch.rand(n, 4, generator=gen)
    factors = torch.stack([1 - b + 2 * b * u[:, 0], 1 - c + 2 * c * u[:, 1], 1 - s + 2 * s * u[:, 2],
                           -h + 2 * h * u[:, 3]], dim=1)
    gray = torch.rand(n, generator=gen) < GRAY_P
    ra_ops = torch.randint(len(RA_OPS), (n, RA_NUM_OPS), generator=gen)
    ra_negative = torch.rand(n, RA_NUM_OPS, generator=gen) <= 0.5
    return ViewParams(boxes, flip, jitter, order, factors, gray, ra_ops, ra_negative)


"""The image operations of the views, on float batches in [0, 1], each image with its own parameters.

Crop + resize + flip is one ``grid_sample``; colour jitter and grayscale use per-image factors; RandAugment
groups the images by (op, sign) and sends each group through torchvision's own functional op. On CUDA the
ops run on the whole batch and are blended in by masks; on the CPU only the selected images go through an op.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from t3ar.method.view_params import RA_BINS, RA_MAGNITUDE, RA_OPS, ViewParams


def crop_flip(images: torch.Tensor, boxes: torch.Tensor, flip: torch.Tensor, size: int) -> torch.Tensor:
    """Crop every image to its box, resize to ``size`` (bilinear, align_corners=False) and mirror where
    ``flip``: one ``grid_sample``. images: float [B, C, H, W]; boxes/flip on any device."""
    n, _, hgt, wid = images.shape
    boxes = boxes.to(images.device, torch.float32)
    top, left, bh, bw = boxes.unbind(1)
    sx, sy = bw / wid, bh / hgt
    cx = (left + bw / 2) / wid * 2 - 1
    cy = (top + bh / 2) / hgt * 2 - 1
    sign = 1 - 2 * flip.to(images.device, torch.float32)
    theta = torch.zeros(n, 2, 3, device=images.device)
    theta[:, 0, 0] = sx * sign
    theta[:, 0, 2] = cx
    theta[:, 1, 1] = sy
    theta[:, 1, 2] = cy
    grid = F.affine_grid(theta, [n, images.shape[1], size, size], align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="border", align_corners=False)


def _gray(x: torch.Tensor) -> torch.Tensor:
    return (0.2989 * x[:, 0:1] + 0.587 * x[:, 1:2] + 0.114 * x[:, 2:3]).expand_as(x)


def _per(f: torch.Tensor) -> torch.Tensor:
    return f.view(-1, 1, 1, 1)


def _rgb_to_hsv(x: torch.Tensor) -> torch.Tensor:
    r, g, b = x.unbind(1)
    maxc, minc = x.amax(1), x.amin(1)
    eqc = maxc == minc
    cr = maxc - minc
    ones = torch.ones_like(maxc)
    s = cr / torch.where(eqc, ones, maxc)
    crd = torch.where(eqc, ones, cr)
    rc, gc, bc = (maxc - r) / crd, (maxc - g) / crd, (maxc - b) / crd
    hr = (maxc == r) * (bc - gc)
    hg = ((maxc == g) & (maxc != r)) * (2.0 + rc - bc)
    hb = ((maxc != g) & (maxc != r)) * (4.0 + gc - rc)
    h = ((hr + hg + hb) / 6.0 + 1.0).fmod(1.0)
    return torch.stack([h, s, maxc], dim=1)


def _hsv_to_rgb(x: torch.Tensor) -> torch.Tensor:
    h, s, v = x.unbind(1)
    i = torch.floor(h * 6.0)
    f = h * 6.0 - i
    i = i.to(torch.int64) % 6
    p = (v * (1.0 - s)).clamp(0.0, 1.0)
    q = (v * (1.0 - s * f)).clamp(0.0, 1.0)
    t = (v * (1.0 - s * (1.0 - f))).clamp(0.0, 1.0)
    a1 = torch.stack((v, q, p, p, t, v), dim=1)
    a2 = torch.stack((t, v, v, q, p, p), dim=1)
    a3 = torch.stack((p, p, t, v, v, q), dim=1)
    sector = i.unsqueeze(1)  # [B, 1, H, W]: which of the 6 hue sectors each pixel is in
    return torch.cat([a.gather(1, sector) for a in (a1, a2, a3)], dim=1)


def _jitter_op(op: int, x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """One ColorJitter op with per-image factors ``f`` [n] (as torchvision's float kernels)."""
    if op == 0:  # brightness: blend with black
        return (x * _per(f)).clamp(0, 1)
    if op == 1:  # contrast: blend with the image's mean grey level
        mean = _gray(x)[:, :1].mean(dim=(1, 2, 3), keepdim=True)
        return (_per(f) * x + (1 - _per(f)) * mean).clamp(0, 1)
    if op == 2:  # saturation: blend with the greyscale image
        return (_per(f) * x + (1 - _per(f)) * _gray(x)).clamp(0, 1)
    hsv = _rgb_to_hsv(x)
    hsv[:, 0] = (hsv[:, 0] + _per(f)[:, 0]) % 1.0
    return _hsv_to_rgb(hsv)


def _masked(x: torch.Tensor) -> bool:
    """On CUDA every op runs on the whole batch and is blended in by a mask (no subset indexing: that needs
    host-side index tensors, and their copies stall the stream); on the CPU only the selected images go
    through an op (less arithmetic, which is what costs there)."""
    return x.device.type == "cuda"


def colour(x: torch.Tensor, p: ViewParams) -> torch.Tensor:
    """Colour jitter (random order per image) then random grayscale, per image."""
    dev = x.device
    order, factors = p.jitter_order, p.jitter_factors
    if _masked(x):
        on = p.jitter[:, None, None] & (order[:, :, None] == torch.arange(4)[None, None, :])  # [B, pos, op]
        on_d, f_d = on.to(dev, non_blocking=True), factors.to(dev, non_blocking=True)
        for pos in range(4):
            for op in range(4):
                if bool(on[:, pos, op].any()):
                    x = torch.where(on_d[:, pos, op].view(-1, 1, 1, 1), _jitter_op(op, x, f_d[:, op]), x)
    else:
        for pos in range(4):
            for op in range(4):
                sel = (p.jitter & (order[:, pos] == op)).nonzero().squeeze(1)
                if len(sel):
                    sd = sel.to(dev)
                    x[sd] = _jitter_op(op, x[sd], factors[sel, op].to(dev))
    if bool(p.gray.any()):
        g = p.gray.to(dev, non_blocking=True).view(-1, 1, 1, 1)
        x = torch.where(g, _gray(x), x)
    return x


def _ra_magnitude(op: str, size: int) -> float:
    """The magnitude torchvision's RandAugment uses for ``op`` at magnitude 9 of 31 bins."""
    m = RA_MAGNITUDE / (RA_BINS - 1)
    return {"ShearX": 0.3 * m, "ShearY": 0.3 * m, "TranslateX": 150.0 / 331.0 * size * m,
            "TranslateY": 150.0 / 331.0 * size * m, "Rotate": 30.0 * m, "Brightness": 0.9 * m, "Color": 0.9 * m,
            "Contrast": 0.9 * m, "Sharpness": 0.9 * m, "Posterize": float(int(round(8 - RA_MAGNITUDE / 7.5))),
            "Solarize": 1.0 - m}.get(op, 0.0)


def _ra_apply(op: str, x: torch.Tensor, mag: float) -> torch.Tensor:
    """torchvision RandAugment's op on a float batch in [0, 1], one magnitude for the whole batch."""
    nearest = InterpolationMode.NEAREST
    if op == "ShearX":
        return TF.affine(x, angle=0.0, translate=[0, 0], scale=1.0, shear=[math.degrees(math.atan(mag)), 0.0],
                         interpolation=nearest, fill=None, center=[0, 0])
    if op == "ShearY":
        return TF.affine(x, angle=0.0, translate=[0, 0], scale=1.0, shear=[0.0, math.degrees(math.atan(mag))],
                         interpolation=nearest, fill=None, center=[0, 0])
    if op in ("TranslateX", "TranslateY"):
        t = [int(mag), 0] if op == "TranslateX" else [0, int(mag)]
        return TF.affine(x, angle=0.0, translate=t, scale=1.0, shear=[0.0, 0.0], interpolation=nearest, fill=None)
    if op == "Rotate":
        return TF.rotate(x, angle=mag, interpolation=nearest, fill=None)
    if op == "Brightness":
        return TF.adjust_brightness(x, brightness_factor=1.0 + mag)
    if op == "Color":
        return TF.adjust_saturation(x, saturation_factor=1.0 + mag)
    if op == "Contrast":
        return TF.adjust_contrast(x, contrast_factor=1.0 + mag)
    if op == "Sharpness":
        return TF.adjust_sharpness(x, sharpness_factor=1.0 + mag)
    if op == "Posterize":
        return TF.posterize(x, bits=int(mag))
    if op == "Solarize":
        return TF.solarize(x, threshold=mag)
    if op == "AutoContrast":
        return TF.autocontrast(x)
    if op == "Equalize":
        return TF.equalize(x)
    return x


SIGNED = frozenset({"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast",
                    "Sharpness"})


def rand_augment(x: torch.Tensor, p: ViewParams) -> torch.Tensor:
    """RandAugment with each image's own ops and signs: one torchvision call per (round, op, sign) group."""
    size = x.shape[-1]
    masked = _masked(x)
    for rnd in range(p.ra_ops.shape[1]):
        ops, neg = p.ra_ops[:, rnd], p.ra_negative[:, rnd]
        for o, name in enumerate(RA_OPS):
            if name == "Identity":
                continue
            for negative in ((False, True) if name in SIGNED else (False,)):
                hit = (ops == o) & (neg == negative) if name in SIGNED else ops == o
                if not bool(hit.any()):
                    continue
                mag = _ra_magnitude(name, size) * (-1.0 if negative else 1.0)
                if masked:
                    m = hit.to(x.device, non_blocking=True).view(-1, 1, 1, 1)
                    x = torch.where(m, _ra_apply(name, x, mag), x)
                else:
                    sel = hit.nonzero().squeeze(1)
                    sd = sel.to(x.device)
                    x[sd] = _ra_apply(name, x[sd], mag)
    return x


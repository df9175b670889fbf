"""The image operations of the views, on float batches in [0, 1], each image with its own parameters.

Every op is torchvision's (its float kernels), applied to a whole batch at once wherever the parameters can
differ per image inside one tensor expression, so that a batch costs a few large kernels rather than one small
call per (op, sign) group:

* crop + resize + flip: one ``grid_sample`` with a per-image affine (bilinear, as the crop's resize);
* the blends (brightness, contrast, saturation; RandAugment's Brightness, Color and Contrast):
  ``clamp(f·x + (1 - f)·m)`` with a per-image factor f and degenerate image m (black, the mean grey level or
  the grey image); images the op does not touch take f = 1, which leaves them exactly as they are;
* hue: one fused RGB -> hue-shifted RGB kernel (torchvision's HSV round trip, written without the
  intermediate HSV tensor);
* RandAugment's geometric ops (shears, translations, rotation): one nearest-neighbour ``grid_sample`` over
  every image that draws one, each with its op's grid (grids are fixed per op, sign and size: cached);
* Sharpness with a per-image factor; Posterize, Solarize, AutoContrast and Equalize through torchvision's own
  functional op, once per op.

Ops that touch only some images run on those images on the CPU (less arithmetic, which is what costs there),
and on the whole batch blended in by masks on CUDA (no host-side index tensors, whose copies stall the stream).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from t3ar.method.view_params import RA_BINS, RA_MAGNITUDE, RA_OPS, ViewParams

# blend kinds: what an image is blended with (0 = not blended)
NONE, BRIGHTNESS, CONTRAST, SATURATION = 0, 1, 2, 3
#: ColorJitter's ops in ``ViewParams.jitter_order``: brightness, contrast, saturation (blends), hue
JITTER_BLENDS = (BRIGHTNESS, CONTRAST, SATURATION)
HUE = 3
GEOMETRIC = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")
RA_BLENDS = {"Brightness": BRIGHTNESS, "Color": SATURATION, "Contrast": CONTRAST}
SIGNED = frozenset({*GEOMETRIC, "Brightness", "Color", "Contrast", "Sharpness"})


def crop_flip(images: torch.Tensor, boxes: torch.Tensor, flip: torch.Tensor, size: int) -> torch.Tensor:
    """Crop every image to its box, resize to ``size`` (bilinear, align_corners=False) and mirror where
    ``flip``: one ``grid_sample``. images: float [B, C, H, W]; boxes/flip on any device.

    The sampling grid is ``affine_grid``'s for the per-image affine (scale and shift per axis, no rotation), built
    separably: x depends on the column only and y on the row only (a batched 3x2 matrix product per pixel is
    slow on the CPU)."""
    n, _, hgt, wid = images.shape
    dev = images.device
    boxes = boxes.to(dev, torch.float32)
    top, left, bh, bw = boxes.unbind(1)
    sign = 1 - 2 * flip.to(dev, torch.float32)
    base = torch.linspace(-1.0 + 1.0 / size, 1.0 - 1.0 / size, size, device=dev)  # output pixel centres
    gx = (bw / wid * sign)[:, None] * base + ((left + bw / 2) / wid * 2 - 1)[:, None]  # [n, size]
    gy = (bh / hgt)[:, None] * base + ((top + bh / 2) / hgt * 2 - 1)[:, None]
    grid = torch.stack((gx[:, None, :].expand(n, size, size), gy[:, :, None].expand(n, size, size)), dim=-1)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="border", align_corners=False)


def _gray1(x: torch.Tensor) -> torch.Tensor:
    """torchvision's grey level (ITU-R 601-2 luma), one channel: [B, 1, H, W]."""
    return 0.2989 * x[:, 0:1] + 0.587 * x[:, 1:2] + 0.114 * x[:, 2:3]


def _gray(x: torch.Tensor) -> torch.Tensor:
    return _gray1(x).expand_as(x)


def _per(f: torch.Tensor) -> torch.Tensor:
    return f.view(-1, 1, 1, 1)


@functools.lru_cache(maxsize=32)
def _const(values: tuple[float, ...], shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """A small constant tensor, made once per device (a fresh host-to-device copy per call would wait for the
    stream on CUDA)."""
    return torch.tensor(values, device=device).view(shape)


def _masked(x: torch.Tensor) -> bool:
    """On CUDA an op that touches some images runs on the whole batch and is blended in by a mask; on the CPU it
    runs on the selected images only."""
    return x.device.type == "cuda"


def blend(x: torch.Tensor, factor: torch.Tensor, kind: torch.Tensor) -> torch.Tensor:
    """Each image blended with its degenerate image by its own factor, clamped to [0, 1] (torchvision's
    ``adjust_brightness`` / ``adjust_contrast`` / ``adjust_saturation``): ``kind`` [B] (CPU) says which
    (BRIGHTNESS: black, CONTRAST: the image's mean grey level, SATURATION: its grey image; NONE: untouched),
    ``factor`` [B] (CPU) the blend factor. Arithmetic only (no ``torch.where``: several times slower per element
    than a multiply on the CPU)."""
    active = kind != NONE
    if not bool(active.any()):
        return x
    dev = x.device
    f = _per(torch.where(active, factor, 1.0).to(dev, non_blocking=True))
    is_c, is_s = kind == CONTRAST, kind == SATURATION
    if not (bool(is_c.any()) or bool(is_s.any())):
        return (f * x).clamp_(0, 1)  # brightness only: the blend with black
    g = _gray1(x)
    mean = g.mean(dim=(1, 2, 3), keepdim=True) if bool(is_c.any()) else None
    m = g.mul_(_per(is_s.float().to(dev, non_blocking=True)))  # the grey image where saturation, else 0
    if mean is not None:
        m = m.add_(mean * _per(is_c.float().to(dev, non_blocking=True)))
    return (f * x).add_(m.mul_(1 - f)).clamp_(0, 1)


def hue(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """torchvision's ``adjust_hue`` with a per-image ``shift`` [B] (on x's device), without the HSV tensor.

    torchvision's hue h6 in [-1, 5) (6 x its h), with the same tie rule (red, then green, then blue is the
    maximum), then each channel n of the result is v - (v - min)·clamp(min(k, 4 - k), 0, 1) with
    k = (n + h6 + 6·shift) mod 6 and n = 5, 3, 1 for R, G, B: value and saturation kept, as in the round trip.
    Masks are multiplied in rather than selected with ``torch.where`` (much cheaper per element on the CPU)."""
    r, g, b = x.unbind(1)
    maxc = torch.maximum(torch.maximum(r, g), b)
    cr = maxc - torch.minimum(torch.minimum(r, g), b)
    rm = (maxc == r).float()
    gm = (maxc == g).float().mul_(1.0 - rm)
    bm = 1.0 - rm - gm
    num = rm * (g - b) + gm * (b - r) + bm * (r - g)  # 0 where the pixel is grey (cr = 0)
    h6 = num.div_(cr.clamp_min(1e-12)).add_(2.0 * gm + 4.0 * bm).add_((6.0 * shift + 12.0).view(-1, 1, 1))
    k = _const((5.0, 3.0, 1.0), (1, 3, 1, 1), x.device) + h6.unsqueeze(1)
    k = k.sub_(torch.floor(k * (1.0 / 6.0)).mul_(6.0))
    w = torch.minimum(k, 4.0 - k).clamp_(0.0, 1.0)
    return (maxc.unsqueeze(1) - cr.unsqueeze(1) * w).clamp_(0.0, 1.0)


def _on_selected(x: torch.Tensor, hit: torch.Tensor, op: object) -> torch.Tensor:
    """``op(images)`` applied to the images where ``hit`` [B] (CPU bool); ``op`` also gets the selected rows'
    indices (CPU) so it can pick their parameters."""
    if not bool(hit.any()):
        return x
    if _masked(x):
        rows = torch.arange(len(x))
        return torch.where(_per(hit.to(x.device, non_blocking=True)), op(x, rows), x)  # type: ignore[operator]
    sel = hit.nonzero().squeeze(1)
    sd = sel.to(x.device)
    x[sd] = op(x.index_select(0, sd), sel)  # type: ignore[operator]  # index_select: a row copy, ~3x faster than x[sd]
    return x


def _blend_some(x: torch.Tensor, factor: torch.Tensor, kind: torch.Tensor) -> torch.Tensor:
    """:func:`blend` where the images it leaves untouched (kind NONE) are skipped on the CPU."""
    if _masked(x):
        return blend(x, factor, kind)
    return _on_selected(x, kind != NONE, lambda xs, rows: blend(xs, factor[rows], kind[rows]))


def colour(x: torch.Tensor, p: ViewParams) -> torch.Tensor:
    """Colour jitter (random order per image) then random grayscale, per image. At each of the 4 positions in
    the order, one blend over the batch (each image its own op and factor) and the hue shift of the images
    whose op there is hue."""
    order, factors, on = p.jitter_order, p.jitter_factors, p.jitter
    blends = torch.tensor([*JITTER_BLENDS, NONE])
    for pos in range(4 if bool(on.any()) else 0):
        op = order[:, pos]
        f = factors.gather(1, op[:, None]).squeeze(1)
        x = _blend_some(x, f, torch.where(on, blends[op], NONE))
        x = _on_selected(x, on & (op == HUE), lambda xs, rows, f=f: hue(xs, f[rows].to(xs.device)))
    return _on_selected(x, p.gray, lambda xs, _rows: _gray(xs).contiguous())


def _ra_magnitude(op: str, size: int) -> float:
    """The magnitude torchvision's RandAugment uses for ``op`` at magnitude 9 of 31 bins."""
    m = RA_MAGNITUDE / (RA_BINS - 1)
    return {"ShearX": 0.3 * m, "ShearY": 0.3 * m, "TranslateX": 150.0 / 331.0 * size * m,
            "TranslateY": 150.0 / 331.0 * size * m, "Rotate": 30.0 * m, "Brightness": 0.9 * m, "Color": 0.9 * m,
            "Contrast": 0.9 * m, "Sharpness": 0.9 * m, "Posterize": float(int(round(8 - RA_MAGNITUDE / 7.5))),
            "Solarize": 1.0 - m}.get(op, 0.0)


def _ra_apply(op: str, x: torch.Tensor, mag: float) -> torch.Tensor:
    """torchvision RandAugment's op on a batch, one magnitude for the whole batch (the reference the batched
    ops are tested against, and the kernel of the ops without per-image parameters)."""
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


def _inverse_affine(center: tuple[float, float], angle: float, translate: tuple[float, float],
                    shear: tuple[float, float]) -> list[float]:
    """torchvision's ``_get_inverse_affine_matrix`` (scale 1): the output -> input pixel map of an affine."""
    rot, sx, sy = math.radians(angle), math.radians(shear[0]), math.radians(shear[1])
    (cx, cy), (tx, ty) = center, translate
    a = math.cos(rot - sy) / math.cos(sy)
    b = -(a * math.tan(sx) + math.sin(rot))
    c = math.sin(rot - sy) / math.cos(sy)
    d = math.cos(rot) - c * math.tan(sx)
    m = [d, -b, 0.0, -c, a, 0.0]
    m[2] += cx - m[0] * (cx + tx) - m[1] * (cy + ty)
    m[5] += cy - m[3] * (cx + tx) - m[4] * (cy + ty)
    return m


def _geometric_matrix(op: str, mag: float, size: int) -> list[float]:
    """The inverse affine torchvision's ``affine`` / ``rotate`` build for RandAugment's op at ``mag``."""
    corner = (-size * 0.5, -size * 0.5)  # the shears turn about the top-left corner (center=[0, 0])
    if op == "ShearX":
        return _inverse_affine(corner, 0.0, (0.0, 0.0), (math.degrees(math.atan(mag)), 0.0))
    if op == "ShearY":
        return _inverse_affine(corner, 0.0, (0.0, 0.0), (0.0, math.degrees(math.atan(mag))))
    if op == "TranslateX":
        return _inverse_affine((0.0, 0.0), 0.0, (float(int(mag)), 0.0), (0.0, 0.0))
    if op == "TranslateY":
        return _inverse_affine((0.0, 0.0), 0.0, (0.0, float(int(mag))), (0.0, 0.0))
    return _inverse_affine((0.0, 0.0), -(mag % 360), (0.0, 0.0), (0.0, 0.0))  # rotate: angle direction flipped


@functools.lru_cache(maxsize=16)
def _geometric_grids(size: int, device: torch.device) -> torch.Tensor:
    """[len(GEOMETRIC) * 2, size, size, 2] sampling grids (torchvision's ``_affine_grid``), row 2·i + negative
    for GEOMETRIC[i]."""
    mats = [_geometric_matrix(op, _ra_magnitude(op, size) * (-1.0 if neg else 1.0), size)
            for op in GEOMETRIC for neg in (False, True)]
    theta = torch.tensor(mats, dtype=torch.float32).view(-1, 2, 3)
    base = torch.empty(1, size, size, 3)
    base[..., 0].copy_(torch.linspace((1.0 - size) * 0.5, (size - 1.0) * 0.5, steps=size))
    base[..., 1].copy_(torch.linspace((1.0 - size) * 0.5, (size - 1.0) * 0.5, steps=size).unsqueeze_(-1))
    base[..., 2].fill_(1)
    scaled = theta.transpose(1, 2).div_(torch.tensor([0.5 * size, 0.5 * size]))
    grids = base.view(1, size * size, 3).expand(len(mats), -1, -1).bmm(scaled)
    return grids.view(len(mats), size, size, 2).to(device)


def _geometric(x: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
    """Each image through its own geometric op: ``code`` [B] (CPU) rows of :func:`_geometric_grids`."""
    grids = _geometric_grids(x.shape[-1], x.device)[code.to(x.device)]
    return F.grid_sample(x, grids, mode="nearest", padding_mode="zeros", align_corners=False)


def _sharpness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """torchvision's ``adjust_sharpness`` with a per-image ``factor`` [B] (on x's device): the interior blended
    with a 3x3 smoothing, the border kept."""
    if x.shape[-1] <= 2 or x.shape[-2] <= 2:
        return x
    a, b = 1.0 / 13.0, 5.0 / 13.0
    kernel = _const((a, a, a, a, b, a, a, a, a), (1, 1, 3, 3), x.device).expand(x.shape[1], 1, 3, 3)
    out = x.clone()
    blurred = F.conv2d(out, kernel, groups=x.shape[1])
    inner = out[..., 1:-1, 1:-1]
    inner.add_((blurred - inner) * _per(1.0 - factor))
    return out.clamp_(0, 1)


_RA_INDEX = {name: i for i, name in enumerate(RA_OPS)}
_GEO_OPS = torch.tensor([_RA_INDEX[g] for g in GEOMETRIC])
#: per RandAugment op: its blend kind (NONE unless a blend) and unsigned magnitude (the blends' do not depend on
#: the image size)
_RA_BLEND_KIND = torch.tensor([RA_BLENDS.get(name, NONE) for name in RA_OPS])
_RA_BLEND_MAG = torch.tensor([_ra_magnitude(name, 1) if name in RA_BLENDS else 0.0 for name in RA_OPS])


def rand_augment(x: torch.Tensor, p: ViewParams) -> torch.Tensor:
    """RandAugment with each image's own ops and signs. Per round: one grid_sample for the geometric ops, one
    blend for Brightness / Color / Contrast, one Sharpness, and one torchvision call for each other op drawn."""
    size = x.shape[-1]
    geo_first, sharp = _RA_INDEX[GEOMETRIC[0]], _RA_INDEX["Sharpness"]
    for rnd in range(p.ra_ops.shape[1]):
        ops, neg = p.ra_ops[:, rnd], p.ra_negative[:, rnd]
        sign = 1.0 - 2.0 * neg.float()
        is_geo = torch.isin(ops, _GEO_OPS)
        code = torch.where(is_geo, (ops - geo_first) * 2 + neg.long(), 0)  # any valid row where not geometric
        x = _on_selected(x, is_geo, lambda xs, rows, code=code: _geometric(xs, code[rows]))
        x = _blend_some(x, 1.0 + sign * _RA_BLEND_MAG[ops], _RA_BLEND_KIND[ops])
        f_sharp = 1.0 + sign * _ra_magnitude("Sharpness", size)
        x = _on_selected(x, ops == sharp, lambda xs, rows, f=f_sharp: _sharpness(xs, f[rows].to(xs.device)))
        for name in ("Posterize", "Solarize", "AutoContrast", "Equalize"):
            mag = _ra_magnitude(name, size)
            x = _on_selected(x, ops == _RA_INDEX[name], lambda xs, _rows, name=name, mag=mag: _ra_apply(name, xs, mag))
    return x

"""Weak t(x) and strong t'(x) views (AdaContrast's recipe), computed a batch at a time, drawn per image.

The distribution is torchvision's per-image pipeline (``RandomResizedCrop`` -> ``RandomHorizontalFlip`` for
the weak view; plus ``ColorJitter(0.4, 0.4, 0.4, 0.1)`` with p = 0.8 in a random order, ``RandomGrayscale``
with p = 0.2 and ``RandAugment(num_ops=2, magnitude=9)`` for the strong one), but every random parameter
is drawn per image into a tensor and the image operations run once per batch on the batch's device:

* crop + resize + flip: one ``grid_sample`` with a per-image affine (bilinear, as the crop's resize);
* colour jitter and grayscale: per-image factors broadcast over the batch, each jitter op applied to the
  images whose random order puts it at that position;
* RandAugment: each image draws its own 2 ops and signs; images are grouped by (op, sign) and each group
  goes through torchvision's own functional op once (all ops of one magnitude share their parameters).

Images stay float in [0, 1] from the first op on (torchvision rounds to uint8 after every op: a
difference of at most half a grey level per op). Randomness comes from the ``generator`` given (a CPU
generator, so a seed gives the same views on every device); parameters are tensors on the CPU, moved to
the device once per batch.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from t3ar.method.augment import Normalizer

RATIO = (3.0 / 4.0, 4.0 / 3.0)
JITTER = (0.4, 0.4, 0.4, 0.1)  # brightness, contrast, saturation, hue
JITTER_P, GRAY_P = 0.8, 0.2
RA_OPS: tuple[str, ...] = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness",
                           "Color", "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize")
RA_NUM_OPS, RA_MAGNITUDE, RA_BINS = 2, 9, 31
# Memory layout per device type: views come out in it and the adaptation loop puts the model in it. Measured
# (Lite0, 64 px, batch 32): channels-last makes a CPU forward+backward 2.5x and a no-grad forward 1.7x faster;
# on an H100 under AMP it makes every step 1.9-2.5x slower. An entry may be switched off for an experiment.
CHANNELS_LAST: dict[str, bool] = {"cpu": True, "cuda": False}


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


def render(images: torch.Tensor, p: ViewParams, spec: ViewSpec) -> torch.Tensor:
    """The views of uint8 [B, 3, S, S] ``images`` with parameters ``p``: float in [0, 1], on images' device."""
    size = images.shape[-1]
    x = crop_flip(images.float().div_(255), p.boxes, p.flip, size)
    if spec.strong:
        x = rand_augment(colour(x, p), p)
    return x


class Views:
    """Normalised weak / strong views of uint8 batches on ``norm.device``, with their own random stream.

    Views come out in the device's layout (:data:`CHANNELS_LAST`).
    """

    def __init__(self, norm: Normalizer, generator: torch.Generator,
                 extra_generator: torch.Generator | None = None) -> None:
        self.norm = norm
        self.gen = generator
        self.extra_gen = extra_generator or generator  # draws the views of ``strong_with``'s extra images
        self.seconds = 0.0  # wall time spent making views so far

    def _make(self, images: torch.Tensor, spec: ViewSpec, extra: torch.Tensor | None = None) -> torch.Tensor:
        if len(images) == 0 and extra is None:
            return torch.empty(0, *images.shape[1:], device=self.norm.device)
        t0 = time.perf_counter()
        p = sample_params(len(images), images.shape[-1], spec, self.gen)
        if extra is not None:
            p = cat_params(p, sample_params(len(extra), extra.shape[-1], spec, self.extra_gen))
            images = torch.cat([images.to(self.norm.device, non_blocking=True),
                                extra.to(self.norm.device, non_blocking=True)])
        x = render(images.to(self.norm.device, non_blocking=True), p, spec)
        out = self._layout((x - self.norm.mean) / self.norm.std)
        self.seconds += time.perf_counter() - t0
        return out

    def weak(self, images: torch.Tensor) -> torch.Tensor:
        return self._make(images, WEAK)

    def strong(self, images: torch.Tensor) -> torch.Tensor:
        return self._make(images, STRONG)

    def strong_with(self, images: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
        """Strong views of ``images`` then of ``extra``, rendered in one call; the extra images' parameters come
        from their own stream, so the views of ``images`` are what ``strong(images)`` would give (paired runs
        with and without extra images see the same target views)."""
        return self._make(images, STRONG, extra)

    def plain(self, images: torch.Tensor) -> torch.Tensor:
        """No augmentation: the evaluation transform."""
        return self._layout(self.norm(images))

    def _layout(self, x: torch.Tensor) -> torch.Tensor:
        if CHANNELS_LAST.get(self.norm.device.type, False):
            return x.contiguous(memory_format=torch.channels_last)
        return x

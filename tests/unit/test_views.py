"""Batched views: the same distribution as torchvision's per-image pipeline, drawn per image, seeded."""

import math

import pytest
import torch
from torchvision.transforms.v2 import functional as TF

from t3ar.method import view_ops as O
from t3ar.method import view_params as P
from t3ar.method import views as V
from t3ar.method.augment import Normalizer


def _images(n: int = 8, size: int = 32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=g)


@pytest.mark.parametrize("spec", [P.WEAK, P.STRONG])
def test_parameter_ranges_match_torchvision(spec: P.ViewSpec) -> None:
    n, size = 4000, 64
    p = P.sample_params(n, size, spec, torch.Generator().manual_seed(1))
    top, left, h, w = p.boxes.unbind(1)
    assert (h >= 1).all() and (w >= 1).all() and (h <= size).all() and (w <= size).all()
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= size).all() and (left + w <= size).all()
    area = h * w / size**2
    ratio = w / h
    # RandomResizedCrop: area in scale (up to rounding), aspect ratio in [3/4, 4/3] (up to rounding)
    assert area.min() >= spec.scale[0] * 0.9 and area.max() <= spec.scale[1] + 1e-6
    assert ratio.min() >= 0.75 * 0.9 and ratio.max() <= 4 / 3 * 1.1
    assert abs(float(p.flip.float().mean()) - 0.5) < 0.05
    if not spec.strong:
        assert not p.jitter.any() and not p.gray.any() and p.ra_ops.numel() == 0
        return
    assert abs(float(p.jitter.float().mean()) - P.JITTER_P) < 0.03
    assert abs(float(p.gray.float().mean()) - P.GRAY_P) < 0.03
    b, c, s, hue = p.jitter_factors.unbind(1)
    for f, width in ((b, 0.4), (c, 0.4), (s, 0.4)):
        assert f.min() >= 1 - width and f.max() <= 1 + width and abs(float(f.mean()) - 1) < 0.02
    assert hue.min() >= -0.1 and hue.max() <= 0.1
    assert all(sorted(row.tolist()) == [0, 1, 2, 3] for row in p.jitter_order[:50])  # a permutation per image
    assert p.ra_ops.shape == (n, P.RA_NUM_OPS)
    counts = torch.bincount(p.ra_ops.flatten(), minlength=len(P.RA_OPS)).float()
    expected = n * P.RA_NUM_OPS / len(P.RA_OPS)
    assert (counts - expected).abs().max() < 5 * math.sqrt(expected)  # uniform over the 14 ops


def test_magnitudes_are_torchvisions() -> None:
    # torchvision RandAugment(num_ops=2, magnitude=9, num_magnitude_bins=31), as in its _AUGMENTATION_SPACE
    m = torch.linspace(0.0, 1.0, 31)[9].item()
    assert O._ra_magnitude("Rotate", 64) == pytest.approx(30.0 * m)
    assert O._ra_magnitude("ShearX", 64) == pytest.approx(0.3 * m)
    assert O._ra_magnitude("TranslateY", 64) == pytest.approx(150.0 / 331.0 * 64 * m)
    assert O._ra_magnitude("Brightness", 64) == pytest.approx(0.9 * m)
    assert O._ra_magnitude("Posterize", 64) == int((8 - (torch.arange(31) / ((31 - 1) / 4))).round().int()[9])
    assert O._ra_magnitude("Solarize", 64) == pytest.approx(float(torch.linspace(1.0, 0.0, 31)[9]))


@pytest.mark.parametrize("op,fn,factor", [(0, TF.adjust_brightness, 1.3), (1, TF.adjust_contrast, 0.7),
                                          (2, TF.adjust_saturation, 1.25), (3, TF.adjust_hue, -0.08)])
def test_jitter_ops_equal_torchvision_per_image(op: int, fn: object, factor: float) -> None:
    x = _images().float() / 255
    f = torch.full((len(x),), factor)
    ours = O.hue(x.clone(), f) if op == O.HUE else O.blend(x.clone(), f, torch.full((len(x),), O.JITTER_BLENDS[op]))
    ref = torch.stack([fn(img, factor) for img in x])  # type: ignore[operator]
    assert torch.allclose(ours, ref, atol=1e-5)


def test_crop_flip_is_resized_crop_and_mirror() -> None:
    x = _images(2, 32).float()
    whole = torch.tensor([[0.0, 0.0, 32.0, 32.0]] * 2)
    assert torch.allclose(O.crop_flip(x, whole, torch.tensor([False, True]), 32)[1], x[1].flip(-1), atol=1e-3)
    box = torch.tensor([[4.0, 6.0, 16.0, 20.0]] * 2)
    ours = O.crop_flip(x, box, torch.tensor([False, False]), 32)[0]
    ref = TF.resized_crop(x[:1], 4, 6, 16, 20, [32, 32], antialias=True)[0]
    inner = (slice(None), slice(2, -2), slice(2, -2))  # edges differ: we sample the image around the crop
    assert (ours[inner] - ref[inner]).abs().mean() < 1.0 and (ours[inner] - ref[inner]).abs().max() < 40


@pytest.mark.parametrize("masked", [False, True])
def test_batched_rand_augment_is_torchvisions_op_per_image(masked: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every RandAugment op and sign, each image with its own, in one batch: the batched kernels (one grid for
    the geometric ops, one blend, one Sharpness) give what torchvision's float op gives on each image alone."""
    monkeypatch.setattr(O, "_masked", lambda _x: masked)
    size = 32
    cases = [(o, neg) for o, name in enumerate(P.RA_OPS) for neg in ((False, True) if name in O.SIGNED else (False,))]
    x = _images(len(cases), size, seed=4).float() / 255
    x[:, :, :3] = 0.5  # grey rows: hue-free pixels and ties
    ops = torch.tensor([[o, 0] for o, _ in cases])  # round 2: Identity
    neg = torch.tensor([[n, False] for _, n in cases])
    p = P.sample_params(len(cases), size, P.STRONG, torch.Generator().manual_seed(0))
    p = P.ViewParams(p.boxes, p.flip, p.jitter, p.jitter_order, p.jitter_factors, p.gray, ops, neg)
    ours = O.rand_augment(x.clone(), p)
    for i, (o, negative) in enumerate(cases):
        name = P.RA_OPS[o]
        ref = O._ra_apply(name, x[i:i + 1], O._ra_magnitude(name, size) * (-1.0 if negative else 1.0))
        assert torch.allclose(ours[i:i + 1], ref, atol=1e-5), (name, negative)


def test_blend_leaves_untouched_images_exactly() -> None:
    x = _images(6, 16).float() / 255
    kind = torch.tensor([O.NONE, O.BRIGHTNESS, O.NONE, O.CONTRAST, O.SATURATION, O.NONE])
    out = O.blend(x.clone(), torch.full((6,), 1.3), kind)
    assert torch.equal(out[kind == O.NONE], x[kind == O.NONE])
    assert not torch.equal(out[kind != O.NONE], x[kind != O.NONE])


def test_views_differ_per_image_and_are_seeded() -> None:
    one = _images(1, 32)
    batch = one.expand(16, -1, -1, -1).contiguous()  # 16 copies of the same image
    norm = Normalizer((0.5, 0.5, 0.5), (0.5, 0.5, 0.5), torch.device("cpu"))
    for kind in ("weak", "strong"):
        a = getattr(V.Views(norm, torch.Generator().manual_seed(3)), kind)(batch)
        b = getattr(V.Views(norm, torch.Generator().manual_seed(3)), kind)(batch)
        c = getattr(V.Views(norm, torch.Generator().manual_seed(4)), kind)(batch)
        assert a.shape == (16, 3, 32, 32) and a.dtype == torch.float32
        assert torch.equal(a, b) and not torch.equal(a, c)
        distinct = {tuple(v.flatten()[:64].tolist()) for v in a}
        assert len(distinct) >= 14  # each copy got its own draw


def test_masked_path_equals_subset_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA code path (whole-batch ops blended by masks) gives the CPU path's result on the same draws."""
    x = _images(24, 32, seed=5)
    p = P.sample_params(24, 32, P.STRONG, torch.Generator().manual_seed(7))
    subset = V.render(x, p, P.STRONG)
    monkeypatch.setattr(O, "_masked", lambda _x: True)
    masked = V.render(x, p, P.STRONG)
    assert torch.allclose(subset, masked, atol=1e-6)


def test_strong_views_change_colour_statistics_weak_do_not() -> None:
    x = _images(64, 32, seed=2)
    norm = Normalizer((0.0, 0.0, 0.0), (1.0, 1.0, 1.0), torch.device("cpu"))
    v = V.Views(norm, torch.Generator().manual_seed(0))
    ref = x.float().div(255).mean(dim=(2, 3))
    weak = v.weak(x).mean(dim=(2, 3))
    strong = v.strong(x).mean(dim=(2, 3))
    assert (weak - ref).abs().mean() < 0.02  # crops and flips keep the colour distribution
    assert (strong - ref).abs().mean() > 0.03  # jitter, grayscale and RandAugment do not


def test_strong_with_keeps_the_target_views_of_strong() -> None:
    """Common random numbers: the target's views do not depend on how many pool images join the call."""
    x, pool = _images(8, 32, seed=1), _images(5, 32, seed=2)
    norm = Normalizer((0.5, 0.5, 0.5), (0.5, 0.5, 0.5), torch.device("cpu"))

    def fresh() -> V.Views:
        return V.Views(norm, torch.Generator().manual_seed(0), torch.Generator().manual_seed(1))

    alone = fresh().strong(x)
    joint = fresh().strong_with(x, pool)
    assert joint.shape[0] == 13 and torch.equal(joint[:8], alone)
    assert not torch.equal(joint[8:], fresh().strong(pool)[:5])  # the pool's own stream, not the target's


def test_same_draws_give_torchvisions_images() -> None:
    """Given one image's draws, the batched views equal torchvision's per-image functional ops (up to the uint8
    rounding torchvision does after every op, and the crop's border pixels)."""
    n, size = 16, 32
    x = _images(n, size, seed=9)
    p = P.sample_params(n, size, P.STRONG, torch.Generator().manual_seed(2))
    ours = O.rand_augment(O.colour(O.crop_flip(x.float() / 255, p.boxes, p.flip, size), p), p)
    jitter = [TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation, TF.adjust_hue]
    diffs = []
    for i in range(n):
        top, left, h, w = (int(v) for v in p.boxes[i])
        img = TF.resized_crop(x[i], top, left, h, w, [size, size], antialias=True)
        img = TF.horizontal_flip(img) if p.flip[i] else img
        if p.jitter[i]:
            for op in p.jitter_order[i].tolist():
                img = jitter[op](img, float(p.jitter_factors[i, op]))
        img = TF.rgb_to_grayscale(img, num_output_channels=3) if p.gray[i] else img
        for r in range(P.RA_NUM_OPS):
            name = P.RA_OPS[int(p.ra_ops[i, r])]
            mag = O._ra_magnitude(name, size) * (-1.0 if name in O.SIGNED and bool(p.ra_negative[i, r]) else 1.0)
            img = O._ra_apply(name, img, 255 * mag if name == "Solarize" else mag)  # uint8, as torchvision runs it
        diffs.append(float((ours[i] * 255 - img.float()).abs().mean()))
    assert sorted(diffs)[n // 2] < 4 and max(diffs) < 12, diffs  # grey levels of 255

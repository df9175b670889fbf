"""The smoke plan's data: synthetic 'styles' of the same three shape classes (each style its own colours and
texture), a clipart-like pool of other shapes, and a tiny random model. Seconds to make; tests the plumbing,
says nothing about the method."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

CLASSES = ("circle", "square", "triangle")
STYLES = {  # background, foreground, noise amplitude
    "plain": ((255, 255, 255), (0, 0, 0), 0),
    "ink": ((240, 235, 220), (20, 20, 90), 20),
    "neon": ((10, 10, 10), (40, 255, 80), 30),
    "pastel": ((250, 210, 230), (120, 170, 250), 10),
}


def _shape(draw: ImageDraw.ImageDraw, kind: str, rng: np.random.Generator, size: int, fill: tuple[int, ...]) -> None:
    o = int(rng.integers(2, size // 4))
    s = int(rng.integers(size // 2, size - o))
    box = (o, o, o + s, o + s)
    if kind == "circle":
        draw.ellipse(box, fill=fill)
    elif kind == "square":
        draw.rectangle(box, fill=fill)
    elif kind == "triangle":
        draw.polygon([(o, o + s), (o + s, o + s), (o + s // 2, o)], fill=fill)
    else:  # pool clutter: lines
        for _ in range(4):
            draw.line([tuple(int(v) for v in rng.integers(0, size, 2)) for _ in range(2)], fill=fill, width=3)


def _image(style: str, kind: str, rng: np.random.Generator, size: int = 40) -> Image.Image:
    bg, fg, noise = STYLES[style]
    img = Image.new("RGB", (size, size), bg)
    _shape(ImageDraw.Draw(img), kind, rng, size, fg)
    a = np.asarray(img).astype(int) + (rng.integers(-noise, noise + 1, (size, size, 3)) if noise else 0)
    return Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))


def make_smoke_data(root: Path, per_class: int = 16, pool_items: int = 24, seed: int = 0) -> dict[str, Path]:
    """``root/styles/<style>/<class>/*.png`` (ImageFolder per style) and ``root/pool/*.png``."""
    rng = np.random.default_rng(seed)
    for style in STYLES:
        for c in CLASSES:
            folder = root / "styles" / style / c
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                _image(style, c, rng).save(folder / f"{c}-{i}.png")
    pool = root / "pool"
    pool.mkdir(parents=True, exist_ok=True)
    for i in range(pool_items):
        _image(list(STYLES)[i % len(STYLES)], "lines", rng).save(pool / f"clip-{i}.png")
    return {"styles": root / "styles", "pool": pool}


def tiny_model(path: Path, image_size: int = 32) -> Path:
    from t3ar.models.backbones import BackboneSpec
    from t3ar.models.checkpoint import save_checkpoint
    from t3ar.models.classifier import ModelSpec, build_classifier

    spec = ModelSpec(backbone=BackboneSpec(name="mobilenetv2_050", weights="none"), classes=CLASSES,
                     image_size=image_size)
    save_checkpoint(path, build_classifier(spec), spec)
    return path

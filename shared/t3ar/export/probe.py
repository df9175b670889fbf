"""The images an export is checked on: a target's own images when given, else a deterministic generated set.

Generated images are drawn with Pillow from a seeded generator (a background gradient, then filled ellipses,
rectangles and thick lines in random colours, then a little noise), so every checkpoint can be checked without
data, and two runs check on the same pixels. They are real RGB pictures, not noise: a classifier's logits on them
spread like on photos, which a near-constant input would not test.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from t3ar.data.images import is_image_name, open_image, to_tensor_uint8
from t3ar.errors import ImageDecodeError

#: How many images the parity check runs on (the issue's contract: 64).
PROBE_COUNT = 64


def generated_images(n: int, size: int, seed: int = 0) -> torch.Tensor:
    """``n`` deterministic RGB pictures as uint8 ``[n, 3, size, size]`` (the models' input before normalising)."""
    rng = np.random.default_rng(seed)
    out = torch.empty((n, 3, size, size), dtype=torch.uint8)
    ramp = np.linspace(0.0, 1.0, size, dtype=np.float32)
    for i in range(n):
        a, b = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
        t = ramp[None, :, None] if rng.random() < 0.5 else ramp[:, None, None]
        base = (a * (1 - t) + b * t) * np.ones((size, size, 1), dtype=np.float32)
        img = Image.fromarray(base.astype(np.uint8), "RGB")
        draw = ImageDraw.Draw(img)
        for _ in range(int(rng.integers(2, 7))):
            x0, y0, x1, y1 = (int(v) for v in np.sort(rng.integers(0, size, 4).reshape(2, 2), axis=0).ravel())
            box = (x0, y0, max(x1, x0 + 2), max(y1, y0 + 2))
            colour = tuple(int(c) for c in rng.integers(0, 256, 3))
            shape = rng.integers(0, 3)
            if shape == 0:
                draw.ellipse(box, fill=colour)
            elif shape == 1:
                draw.rectangle(box, fill=colour)
            else:
                draw.line(box, fill=colour, width=max(1, size // 16))
        arr = np.asarray(img, dtype=np.int16) + rng.integers(-12, 13, (size, size, 3), dtype=np.int16)
        out[i] = torch.from_numpy(np.clip(arr, 0, 255).astype(np.uint8)).permute(2, 0, 1)
    return out


def _first_readable(paths: Sequence[Path], n: int, size: int) -> torch.Tensor:
    """The first ``n`` of ``paths`` that decode, resized and centre-cropped as t3ar reads a target."""
    out: list[torch.Tensor] = []
    for path in paths:
        if len(out) == n:
            break
        try:
            out.append(to_tensor_uint8(open_image(path), size))
        except ImageDecodeError:
            continue  # a target may hold files that are not images: the next one serves
    return torch.stack(out) if out else torch.empty((0, 3, size, size), dtype=torch.uint8)


def images_for_parity(size: int, source: Path | Sequence[Path] | None = None, n: int = PROBE_COUNT, *,
                      name: str | None = None) -> tuple[torch.Tensor, str]:
    """``n`` uint8 images ``[n, 3, size, size]`` and a line saying where they came from: the first ``n`` readable
    images of ``source`` (a folder, searched recursively in name order, an archive of images, or a list of image
    files; resized as t3ar reads a target), topped up with generated ones when it has fewer; all generated
    without ``source``. ``name``: what the line calls ``source`` (default: its file name)."""
    if source is None:
        return generated_images(n, size), f"{n} generated images (seed 0)"
    if isinstance(source, Path):
        name = name or source.name
        if source.is_dir():
            paths: Sequence[Path] = sorted(p for p in source.rglob("*") if p.is_file() and is_image_name(p.name))
        else:
            from t3ar.data.datasets import read_unlabelled

            paths = read_unlabelled(source).paths
    else:
        name, paths = name or "the given images", source
    own = _first_readable(paths, n, size)
    if len(own) == n:
        return own, f"{n} images of {name}"
    extra = generated_images(n - len(own), size)
    return torch.cat([own, extra]), f"{len(own)} images of {name} + {len(extra)} generated (seed 0)"

"""Decoding untrusted images into RGB and fixed-size uint8 tensors."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from t3ar.data.images import (
    IMAGE_SUFFIXES,
    is_image_name,
    letterbox,
    open_image,
    resize_center_crop,
    to_tensor_uint8,
)
from t3ar.errors import ImageDecodeError


def _png_bytes(img: Image.Image, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def test_rgba_transparent_pixels_become_white(tmp_path: Path) -> None:
    img = Image.new("RGBA", (4, 4), (255, 0, 0, 0))
    img.putpixel((1, 1), (0, 0, 255, 255))
    img.putpixel((2, 2), (0, 0, 0, 128))
    path = tmp_path / "a.png"
    img.save(path)
    rgb = open_image(path)
    assert rgb.mode == "RGB"
    assert rgb.getpixel((0, 0)) == (255, 255, 255)
    assert rgb.getpixel((1, 1)) == (0, 0, 255)
    assert rgb.getpixel((2, 2)) == pytest.approx((127, 127, 127), abs=1)


def test_grayscale_la_and_palette_with_transparency() -> None:
    gray = open_image(_png_bytes(Image.new("L", (3, 3), 77)))
    assert gray.mode == "RGB" and gray.getpixel((0, 0)) == (77, 77, 77)
    la = open_image(_png_bytes(Image.new("LA", (3, 3), (0, 0))))
    assert la.getpixel((1, 1)) == (255, 255, 255)
    pal = Image.new("P", (3, 3), 1)
    pal.putpalette([0, 0, 0, 10, 200, 30] + [0] * 762)
    pal.info["transparency"] = 1
    assert open_image(_png_bytes(pal)).getpixel((0, 0)) == (255, 255, 255)


def test_sixteen_bit_grayscale_is_scaled_not_clipped() -> None:
    img = Image.fromarray(np.array([[0, 32896, 65535]], dtype=np.uint16))
    out = open_image(_png_bytes(img))
    assert [out.getpixel((x, 0))[0] for x in range(3)] == [0, 128, 255]


def test_non_image_truncated_and_svg_raise(tmp_path: Path) -> None:
    text = tmp_path / "notes.png"
    text.write_text("hello")
    with pytest.raises(ImageDecodeError, match="notes.png: not a readable image"):
        open_image(text)
    data = _png_bytes(Image.effect_noise((64, 64), 50).convert("RGB"))
    truncated = tmp_path / "cut.png"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(ImageDecodeError, match="truncated or corrupt"):
        open_image(truncated)
    svg = tmp_path / "x.svg"
    svg.write_text("<svg xmlns='http://www.w3.org/2000/svg'/>")
    with pytest.raises(ImageDecodeError, match="SVG"):
        open_image(svg)
    with pytest.raises(ImageDecodeError, match="file not found"):
        open_image(tmp_path / "missing.png")


def test_decompression_bomb_rejected_before_decoding() -> None:
    with pytest.raises(ImageDecodeError, match="decompression bomb"):
        open_image(_png_bytes(Image.new("L", (200, 200))), max_pixels=100 * 100)


def test_is_image_name() -> None:
    assert ".png" in IMAGE_SUFFIXES and ".tiff" in IMAGE_SUFFIXES
    assert is_image_name("a/B.JPG") and is_image_name("x.webp")
    assert not is_image_name("x.svg") and not is_image_name("labels.csv") and not is_image_name("README")


def test_to_tensor_uint8_resizes_shorter_side_and_centre_crops() -> None:
    arr = np.zeros((40, 80, 3), dtype=np.uint8)
    arr[:, :10] = 255  # left eighth white: cropped away by a centre crop
    img = Image.fromarray(arr)
    t = to_tensor_uint8(img, 20)
    assert t.shape == (3, 20, 20) and t.dtype == torch.uint8
    assert int(t.max()) == 0
    assert torch.equal(t, to_tensor_uint8(img, 20))  # deterministic
    assert resize_center_crop(Image.new("RGB", (7, 7)), 7).size == (7, 7)


def test_letterbox_keeps_whole_image_on_white() -> None:
    out = letterbox(Image.new("RGB", (100, 50), (0, 0, 0)), 20)
    assert out.size == (20, 20)
    assert out.getpixel((10, 0)) == (255, 255, 255)
    assert out.getpixel((10, 10)) == (0, 0, 0)

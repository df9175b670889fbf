"""Decoding untrusted image files into RGB, and turning them into fixed-size uint8 tensors.

Contracts:
- :func:`open_image` returns a fully decoded ``RGB`` :class:`PIL.Image.Image` or raises
  :class:`~t3ar.errors.ImageDecodeError`; transparency is composited on white, EXIF orientation applied.
- :func:`resize_center_crop` / :func:`to_tensor_uint8`: shorter side to ``size`` (bicubic, antialiased),
  then a centre crop to ``size``×``size``. Deterministic (pure Pillow, no random state).
- :func:`letterbox`: fit the whole image into ``size``×``size`` on white (for clipart, where cropping would
  cut the object).

SVG is not handled here (the data kit renders SVG with cairosvg first).
"""

from __future__ import annotations

import io
import logging
import threading
import warnings
from pathlib import Path, PurePath

import numpy as np
import torch
from PIL import Image, ImageOps

from t3ar.errors import ImageDecodeError

logger = logging.getLogger(__name__)

IMAGE_SUFFIXES: frozenset[str] = frozenset(
    {".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff"}
)
"""Lower-case file suffixes (with the dot) that we try to decode as images."""

WHITE = (255, 255, 255)

# warnings.catch_warnings() swaps process-global filter state; serialise the (cheap, header-only)
# Image.open call so concurrent threads cannot leave the "error" filter installed for everyone.
_OPEN_LOCK = threading.Lock()

_ALPHA_MODES = frozenset({"RGBA", "LA", "La", "RGBa", "PA"})
_HIGH_DEPTH_PREFIXES = ("I", "F")


def is_image_name(name: str | PurePath) -> bool:
    """True if the name has one of :data:`IMAGE_SUFFIXES` (case-insensitive). SVG is not an image here."""
    return PurePath(name).suffix.lower() in IMAGE_SUFFIXES


def _fail(name: str, reason: str, detail: object) -> ImageDecodeError:
    return ImageDecodeError(
        f"{name}: not a readable image ({reason}): {detail}; remove it or convert it to PNG/JPEG"
    )


def _high_depth_to_l(img: Image.Image) -> Image.Image:
    """16/32-bit integer or float grayscale to 8-bit L (Pillow's own convert clips instead of scaling)."""
    arr = np.asarray(img).astype(np.float64)
    peak = float(arr.max()) if arr.size else 0.0
    if img.mode.startswith("F"):
        scale = 255.0 if peak <= 1.0 else 1.0  # float images are either [0,1] or already [0,255]
    else:
        scale = 1.0 / 257.0 if peak > 255 else 1.0  # 16-bit data → 8-bit
    out = np.clip(np.rint(arr * scale), 0, 255).astype(np.uint8)
    return Image.fromarray(out, mode="L")


def to_rgb(img: Image.Image) -> Image.Image:
    """Any Pillow mode to RGB; alpha (including palette/colour-key transparency) is composited on white."""
    if img.mode == "RGB" and "transparency" not in img.info:
        return img
    if img.mode.startswith(_HIGH_DEPTH_PREFIXES):
        img = _high_depth_to_l(img)
    if img.mode in _ALPHA_MODES or "transparency" in img.info:
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (*WHITE, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return img.convert("RGB")


def _exif_oriented(img: Image.Image, name: str) -> Image.Image:
    """Apply the EXIF orientation tag; a broken EXIF block is ignored rather than failing the image."""
    try:
        oriented = ImageOps.exif_transpose(img)
    except Exception as e:  # metadata only; the pixels are fine
        logger.debug("%s: ignoring unreadable EXIF orientation (%s)", name, e)
        return img
    return oriented if oriented is not None else img


def open_image(source: str | Path | bytes, *, max_pixels: int = 40_000_000) -> Image.Image:
    """Decode ``source`` (a path or the file's bytes) into a new, fully loaded RGB image.

    Animated formats give their first frame; EXIF orientation is applied. Raises ImageDecodeError
    ("<name>: not a readable image (<reason>): <detail>; ...") for non-images, truncated or corrupt files,
    SVG, and images of more than ``max_pixels`` pixels (decompression bombs; checked before decoding pixels).
    """
    fp: io.BytesIO | Path
    if isinstance(source, bytes | bytearray):
        name, fp = "<bytes>", io.BytesIO(source)
    else:
        name, fp = str(source), Path(source)
        if fp.suffix.lower() == ".svg":
            raise _fail(name, "SVG is not supported here", "vector image")
    try:
        with _OPEN_LOCK, warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(fp)
    except FileNotFoundError as e:
        raise _fail(name, "file not found", e) from e
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise _fail(name, "decompression bomb", e) from e
    except Image.UnidentifiedImageError as e:
        raise _fail(name, "unrecognised format", "Pillow cannot identify it") from e
    except Exception as e:  # untrusted input: plugins raise all sorts of exceptions on garbage
        raise _fail(name, "unrecognised format", f"{type(e).__name__}: {e}") from e
    with img:
        width, height = img.size
        if width <= 0 or height <= 0:
            raise _fail(name, "empty image", f"size {width}x{height}")
        if width * height > max_pixels:
            raise _fail(
                name, "decompression bomb", f"{width}x{height} = {width * height} pixels > max {max_pixels}"
            )
        try:
            img.load()
            rgb = to_rgb(_exif_oriented(img, name))
            if rgb is img:  # detach from the file handle that `with img` closes
                rgb = img.copy()
        except Exception as e:  # truncated data (OSError), broken plugins (ValueError, SyntaxError, ...)
            raise _fail(name, "truncated or corrupt", f"{type(e).__name__}: {e}") from e
    return rgb


def resize_center_crop(img: Image.Image, size: int) -> Image.Image:
    """Resize the shorter side to ``size`` (bicubic, antialiased) then centre-crop ``size``×``size``; RGB."""
    if size <= 0:
        raise ValueError(f"size must be positive, got {size}")
    img = to_rgb(img)
    width, height = img.size
    if (width, height) != (size, size):
        scale = size / min(width, height)
        new_w, new_h = max(size, round(width * scale)), max(size, round(height * scale))
        if (new_w, new_h) != (width, height):
            img = img.resize((new_w, new_h), Image.Resampling.BICUBIC, reducing_gap=None)
        left, top = (new_w - size) // 2, (new_h - size) // 2
        img = img.crop((left, top, left + size, top + size))
    return img


PIXEL_DIGEST_SIZE = 128  # the side a pixel digest letterboxes an image to


def pixel_digest(img: Image.Image, size: int = PIXEL_DIGEST_SIZE) -> str:
    """The sha256 of ``img``'s pixels letterboxed to ``size``×``size`` RGB (:func:`letterbox`): the same picture
    in other bytes (re-saved, another lossless format, metadata stripped) has the same digest. The pool data kit's
    content hash (:mod:`t3ar.datakit.pool`) and the API's holdout-target overlap check use it."""
    import hashlib

    return hashlib.sha256(letterbox(img, size).tobytes()).hexdigest()


def file_pixel_digest(path: str | Path, *, max_pixels: int = 40_000_000, size: int = PIXEL_DIGEST_SIZE) -> str:
    """:func:`pixel_digest` of the image file at ``path`` (ImageDecodeError when it does not decode)."""
    return pixel_digest(open_image(path, max_pixels=max_pixels), size)


def letterbox(img: Image.Image, size: int, fill: tuple[int, int, int] = WHITE) -> Image.Image:
    """Fit the whole image in ``size``×``size`` (bicubic, aspect kept), centred on a ``fill`` square; RGB."""
    if size <= 0:
        raise ValueError(f"size must be positive, got {size}")
    img = to_rgb(img)
    width, height = img.size
    scale = size / max(width, height)
    new_w, new_h = max(1, round(width * scale)), max(1, round(height * scale))
    if (new_w, new_h) != (width, height):
        img = img.resize((new_w, new_h), Image.Resampling.BICUBIC, reducing_gap=None)
    if (new_w, new_h) == (size, size):
        return img
    canvas = Image.new("RGB", (size, size), fill)
    canvas.paste(img, ((size - new_w) // 2, (size - new_h) // 2))
    return canvas


def to_tensor_uint8(img: Image.Image, size: int) -> torch.Tensor:
    """A ``uint8`` tensor ``[3, size, size]`` of ``resize_center_crop(img, size)`` (CHW, RGB order)."""
    arr = np.asarray(resize_center_crop(img, size), dtype=np.uint8)
    return torch.from_numpy(arr.copy()).permute(2, 0, 1).contiguous()

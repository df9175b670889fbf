"""The emoji data kit: one label space, several visual styles (a small DomainNet) from npm packages.

Output layout (``build_emoji``)::

    <out>/<style>/<label>/<unified>.png   RGB on white, size×size, same file names in every style
    <out>/LICENSES.md                     package and image licences, with the required attributions
    <out>/manifest.json                   request, classes, counts, package versions

Only emoji present (and readable) in every requested style are kept; ``<label>`` is the slug of the
emoji-datasource ``subcategory`` (or ``category``). Metadata comes from ``emoji-datasource-google``'s
``emoji.json`` (``-twitter`` if only that one is requested); it is fetched for metadata alone when neither
Google nor Twitter style is requested.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from PIL import Image

from t3ar.data.images import open_image, resize_center_crop
from t3ar.datakit.common import (
    atomic_output,
    fetch_npm_package,
    npm_package_info,
    read_manifest,
    slug,
    write_json,
)
from t3ar.errors import ImageDecodeError, InvalidInputError

logger = logging.getLogger(__name__)

KIND = "t3ar-emoji-kit"
PACKAGES: dict[str, str] = {
    "emoji-datasource-google": "16.0.0",
    "emoji-datasource-twitter": "16.0.0",
    "openmoji": "17.0.0",
    "@lobehub/fluent-emoji-3d": "1.1.0",
    "@lobehub/fluent-emoji-flat": "1.1.0",
}
LabelKind = Literal["subcategory", "category"]


@dataclass(frozen=True)
class _Style:
    package: str
    folder: str  # inside the package directory
    suffix: str
    upper: bool  # file names use upper-case unified codes
    flag: str | None = None  # emoji.json field saying the image exists


STYLES: dict[str, _Style] = {
    "google": _Style("emoji-datasource-google", "img/google/64", ".png", False, "has_img_google"),
    "twitter": _Style("emoji-datasource-twitter", "img/twitter/64", ".png", False, "has_img_twitter"),
    "openmoji": _Style("openmoji", "color/svg", ".svg", True),
    "openmoji-black": _Style("openmoji", "black/svg", ".svg", True),
    "fluent3d": _Style("@lobehub/fluent-emoji-3d", "assets", ".webp", False),
    "fluentflat": _Style("@lobehub/fluent-emoji-flat", "assets", ".svg", False),
}
#: the styles a kit has by default (the method benchmark's data); ``fluentflat`` is asked for by name (the continual
#: benchmark's longer stream), so adding it changed no existing kit
DEFAULT_STYLES: tuple[str, ...] = ("google", "twitter", "openmoji", "openmoji-black", "fluent3d")
ALL_STYLES: tuple[str, ...] = tuple(STYLES)

_IMAGE_NOTES = {
    "emoji-datasource-google": "Noto Emoji images by Google: Apache License 2.0 "
    "(https://github.com/googlefonts/noto-emoji).",
    "emoji-datasource-twitter": "Twemoji graphics by Twitter, Inc. and other contributors: CC-BY 4.0 "
    "(https://creativecommons.org/licenses/by/4.0/). Attribution required: \"Twemoji graphics by Twitter, "
    "Inc. and other contributors, licensed under CC-BY 4.0\".",
    "openmoji": "OpenMoji graphics: CC BY-SA 4.0 (https://creativecommons.org/licenses/by-sa/4.0/). "
    "Attribution required: \"All emojis designed by OpenMoji - the open-source emoji and icon project. "
    "License: CC BY-SA 4.0\". The PNG renders here are adaptations: share them under the same licence.",
    "@lobehub/fluent-emoji-3d": "Microsoft Fluent Emoji (3D): MIT licence "
    "(https://github.com/microsoft/fluentui-emoji).",
    "@lobehub/fluent-emoji-flat": "Microsoft Fluent Emoji (Flat): MIT licence "
    "(https://github.com/microsoft/fluentui-emoji).",
}


@dataclass
class EmojiKitReport:
    """What :func:`build_emoji` produced (also what ``manifest.json`` records)."""

    out: Path
    styles: list[str]
    label: str
    size: int
    n_emoji: int
    classes: list[str]
    counts: dict[str, int]  # images written per style
    per_class: dict[str, int]  # emoji per class (same in every style)
    dropped_classes: dict[str, int] = field(default_factory=dict)  # class → emoji, below min_per_class
    missing: dict[str, int] = field(default_factory=dict)  # emoji.json entries without an image, per style
    failed: list[list[str]] = field(default_factory=list)  # [unified, style, reason]
    packages: dict[str, str] = field(default_factory=dict)
    reused: bool = False
    seconds: float = 0.0

    @property
    def n_classes(self) -> int:
        return len(self.classes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"out": str(self.out), "n_classes": self.n_classes}


def _candidates(code: str, style: _Style) -> list[str]:
    """File names to try for a unified code: as is, then without the FE0F variation selectors."""
    names = [code, "-".join(p for p in code.split("-") if p.upper() != "FE0F")]
    return [(n.upper() if style.upper else n.lower()) + style.suffix for n in dict.fromkeys(names)]


def _render(path: Path, size: int) -> Image.Image:
    """RGB size×size on white; SVG is rasterised by cairosvg directly at the output size."""
    if path.suffix.lower() == ".svg":
        import cairosvg  # heavy import, only needed for OpenMoji

        try:
            png = cairosvg.svg2png(url=str(path), output_width=size, output_height=size)
        except Exception as e:  # cairosvg raises many kinds of parse errors
            raise ImageDecodeError(f"{path}: SVG could not be rendered: {e}") from e
        if not isinstance(png, bytes):
            raise ImageDecodeError(f"{path}: SVG rendering produced no PNG")
        return resize_center_crop(open_image(png), size)
    return resize_center_crop(open_image(path), size)


def _licences(infos: Mapping[str, Mapping[str, str]]) -> str:
    lines = [
        "# Licences of this emoji data kit",
        "",
        "Built by `t3ar data emoji` from these npm packages. Category/subcategory labels come from the",
        "emoji-datasource metadata (`emoji.json`).",
        "",
    ]
    for name, info in infos.items():
        lines += [
            f"## {name} {info['version']}",
            "",
            f"- Package licence (package.json): {info['license']}",
            f"- Images: {_IMAGE_NOTES.get(name, 'see the package.')}",
            "",
        ]
    return "\n".join(lines)


def _request(styles: list[str], label: str, size: int, min_per_class: int) -> dict[str, Any]:
    return {
        "styles": styles, "label": label, "size": size, "min_per_class": min_per_class, "packages": PACKAGES
    }


def build_emoji(
    out: Path,
    *,
    cache: Path,
    styles: Sequence[str] = DEFAULT_STYLES,
    label: LabelKind = "subcategory",
    size: int = 64,
    min_per_class: int = 2,
    progress: bool = False,
    package_dirs: Mapping[str, Path] | None = None,
) -> EmojiKitReport:
    """Build (or reuse) the emoji kit in ``out``; see the module docstring for the layout.

    ``package_dirs`` maps npm package names to already extracted ``package/`` folders (skips ``npm pack``).
    Idempotent: when ``out/manifest.json`` records the same request the existing kit is returned
    (``reused=True``). Classes with fewer than ``min_per_class`` emoji are dropped (listed in the report).
    The build happens in a temporary sibling renamed into place, so ``out`` is never half-written.
    Raises InvalidInputError for bad arguments, ToolMissingError when npm is missing or ``npm pack`` fails.
    """
    start = time.monotonic()
    styles = list(dict.fromkeys(styles))
    unknown = [s for s in styles if s not in STYLES]
    if unknown or not styles:
        raise InvalidInputError(f"unknown emoji styles {unknown}; choose from {', '.join(ALL_STYLES)}")
    if label not in ("subcategory", "category"):
        raise InvalidInputError(f"label must be 'subcategory' or 'category', got {label!r}")
    if size <= 0 or min_per_class < 1:
        raise InvalidInputError(f"size and min_per_class must be positive, got {size}, {min_per_class}")
    out = Path(out)
    request = _request(styles, label, size, min_per_class)
    previous = read_manifest(out, KIND)
    if previous is not None and previous.get("request") == request:
        logger.info("emoji kit in %s is up to date", out)
        report = EmojiKitReport(out=out, **previous["report"])
        report.reused, report.seconds = True, round(time.monotonic() - start, 3)
        return report

    metadata_styles = [s for s in ("google", "twitter") if s in styles] or ["google"]
    meta_pkg = STYLES[metadata_styles[0]].package
    needed = list(dict.fromkeys([STYLES[s].package for s in styles] + [meta_pkg]))
    given = dict(package_dirs or {})
    dirs = {p: Path(given[p]) if p in given else fetch_npm_package(p, PACKAGES[p], cache) for p in needed}
    infos = {p: npm_package_info(d) for p, d in dirs.items()}
    entries = json.loads((dirs[meta_pkg] / "emoji.json").read_text(encoding="utf-8"))

    names: dict[str, dict[str, Path]] = {}
    for s in styles:
        folder = dirs[STYLES[s].package] / STYLES[s].folder
        if not folder.is_dir():
            raise InvalidInputError(f"{folder}: missing in {STYLES[s].package}; delete it from the cache")
        names[s] = {p.name: p for p in folder.iterdir()}
    missing: Counter[str] = Counter()
    chosen: dict[str, tuple[str, dict[str, Path]]] = {}  # unified (lower) → (class, style → source)
    for entry in entries:
        code = str(entry.get("unified", ""))
        found: dict[str, Path] = {}
        for s in styles:
            st = STYLES[s]
            hit = next((names[s][n] for n in _candidates(code, st) if n in names[s]), None)
            if hit is not None and (st.flag is None or entry.get(st.flag, True)):
                found[s] = hit
            else:
                missing[s] += 1
        if code and len(found) == len(styles):
            chosen[code.lower()] = (slug(str(entry.get(label) or "unlabelled")), found)

    failed: list[list[str]] = []
    with atomic_output(out) as tmp:
        items: Iterable[tuple[str, tuple[str, dict[str, Path]]]] = sorted(chosen.items())
        if progress:
            from tqdm import tqdm

            items = tqdm(items, total=len(chosen), desc="rendering emoji", unit="emoji")
        kept: dict[str, str] = {}
        for code, (cls, found) in items:
            rendered: dict[str, Image.Image] = {}
            for s in styles:
                try:
                    rendered[s] = _render(found[s], size)
                except ImageDecodeError as e:
                    failed.append([code, s, str(e)])
                    break
            if len(rendered) < len(styles):
                continue
            for s, img in rendered.items():
                (tmp / s / cls).mkdir(parents=True, exist_ok=True)
                img.save(tmp / s / cls / f"{code}.png", format="PNG")
            kept[code] = cls
        if failed:
            logger.warning("%d emoji dropped: an image was unreadable (first: %s)", len(failed), failed[0])
        per_class = Counter(kept.values())
        dropped = {c: n for c, n in sorted(per_class.items()) if n < min_per_class}
        for code, cls in kept.items():
            if cls in dropped:
                for s in styles:
                    (tmp / s / cls / f"{code}.png").unlink()
        for s in styles:
            for cls in dropped:
                (tmp / s / cls).rmdir()
        if dropped:
            logger.info("dropped %d classes of < %d emoji: %s", len(dropped), min_per_class, dropped)
        classes = sorted(c for c in per_class if c not in dropped)
        n_emoji = sum(per_class[c] for c in classes)
        report = EmojiKitReport(
            out=out, styles=styles, label=label, size=size, n_emoji=n_emoji, classes=classes,
            counts={s: n_emoji for s in styles}, per_class={c: per_class[c] for c in classes},
            dropped_classes=dropped, missing=dict(missing), failed=failed,
            packages={infos[p]["name"]: infos[p]["version"] for p in needed},
            seconds=round(time.monotonic() - start, 3),
        )
        (tmp / "LICENSES.md").write_text(_licences({p: infos[p] for p in needed}), encoding="utf-8")
        body = {k: v for k, v in report.to_dict().items() if k not in ("out", "n_classes", "reused")}
        write_json(tmp / "manifest.json", {"kind": KIND, "request": request, "report": body})
    logger.info("emoji kit: %d emoji x %d styles, %d classes in %s", n_emoji, len(styles), len(classes), out)
    return report

"""The labelled emoji archive: many more emoji styles from npm (Iconify JSON sets, an svgmoji sprite), each
labelled with the kit's classes, for a labelled pool whose styles are mostly unlike any target.

Output layout (``build_archive``)::

    <out>/<style>/<class>/<unified>.png   RGB on white, size×size; <unified> as in the emoji kit's file names
    <out>/LICENSES.md                     per style: package, artwork licence, attribution
    <out>/manifest.json                   request; per style: package, version, family, licences, counts per class

Unlike the emoji kit's styles, an archive style keeps every emoji it has whose class (emoji-datasource
``subcategory`` or ``category``) is one of ``classes``: styles need not share emoji. Icon names are mapped to
emoji codes by :class:`~t3ar.datakit.iconify.NameIndex` (a set's own ``chars.json`` first).

Every style records an *artwork family*: styles of one family are the same artwork (another version or
rendering), so a benchmark keeps a target's family out of that target's pool (:func:`family_of`).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from PIL import Image

from t3ar.data.images import letterbox, open_image
from t3ar.datakit.common import atomic_output, fetch_npm_package, npm_package_info, read_manifest, slug, write_json
from t3ar.datakit.emoji import PACKAGES as KIT_PACKAGES
from t3ar.datakit.iconify import NameIndex, codes_of, norm_code, read_iconify, read_svgmoji_sprite
from t3ar.errors import ImageDecodeError, InvalidInputError

logger = logging.getLogger(__name__)

KIND = "t3ar-emoji-archive"
_META_PACKAGE = "emoji-datasource-google"  # emoji.json: code → category/subcategory (the kit's labels)


@dataclass(frozen=True)
class ArchiveStyle:
    """One archive style: where its artwork comes from, what it looks like and which artwork family it is."""

    package: str
    version: str
    family: str
    look: str
    kind: Literal["iconify", "svgmoji"] = "iconify"


_I = "@iconify-json/"
#: every style the archive can build (name → source); names never collide with the emoji kit's styles
ARCHIVE_STYLES: dict[str, ArchiveStyle] = {
    "noto": ArchiveStyle(_I + "noto", "1.2.9", "noto", "flat colour (Google Noto, current)"),
    "noto-v1": ArchiveStyle(_I + "noto-v1", "1.2.5", "noto-blob", "flat colour (Google's earlier 'blob' Noto)"),
    "emojione": ArchiveStyle(_I + "emojione", "1.2.3", "emojione", "flat colour, round shading (Emoji One 2)"),
    "emojione-monotone": ArchiveStyle(_I + "emojione-monotone", "1.2.1", "emojione",
                                      "monochrome silhouettes (Emoji One 2)"),
    "emojione-v1": ArchiveStyle(_I + "emojione-v1", "1.2.3", "emojione-v1", "glossy colour (Emoji One 1)"),
    "fxemoji": ArchiveStyle(_I + "fxemoji", "1.2.2", "fxemoji", "bold flat colour (Firefox OS)"),
    "streamline-emojis": ArchiveStyle(_I + "streamline-emojis", "1.2.4", "streamline",
                                      "outlined colour illustrations (Streamline)"),
    "fluent-emoji": ArchiveStyle(_I + "fluent-emoji", "1.2.7", "fluent", "colour with 3-D-like gradients (Fluent)"),
    "fluent-emoji-flat": ArchiveStyle(_I + "fluent-emoji-flat", "1.2.6", "fluent", "flat colour (Fluent)"),
    "fluent-emoji-high-contrast": ArchiveStyle(_I + "fluent-emoji-high-contrast", "1.2.6", "fluent",
                                               "high-contrast monochrome (Fluent)"),
    "twemoji": ArchiveStyle(_I + "twemoji", "1.2.5", "twemoji", "flat colour (Twemoji)"),
    "openmoji-iconify": ArchiveStyle(_I + "openmoji", "1.2.29", "openmoji", "outlined colour (OpenMoji)"),
    "noto-svgmoji": ArchiveStyle("@svgmoji/noto", "3.2.0", "noto", "flat colour (Noto, 2020)", "svgmoji"),
}
#: what ``t3ar data archive`` builds by default: every style with artwork of its own (``noto-svgmoji`` is an
#: older copy of ``noto``; ``@svgmoji/{blob,openmoji,twemoji}`` 3.2.0 ship no artwork, only code that loads it
#: from a CDN, so they are not styles here)
DEFAULT_ARCHIVE: tuple[str, ...] = tuple(s for s in ARCHIVE_STYLES if s != "noto-svgmoji")
#: the artwork family of each emoji *kit* style (``google`` is Noto artwork: the benchmark source's family)
KIT_FAMILIES: dict[str, str] = {"google": "noto", "twitter": "twemoji", "openmoji": "openmoji",
                                "openmoji-black": "openmoji", "fluent3d": "fluent", "fluentflat": "fluent"}
#: Iconify sets whose ``chars.json`` teach the name → code mapping (fetched whatever styles are built, so a
#: style's mapping never depends on which other styles were asked for)
NAME_SOURCES: tuple[str, ...] = ("noto", "twemoji", "openmoji-iconify", "fluent-emoji-flat")


def family_of(style: str) -> str:
    """The artwork family of a kit or archive style; KeyError for an unknown style."""
    if style in KIT_FAMILIES:
        return KIT_FAMILIES[style]
    return ARCHIVE_STYLES[style].family


@dataclass
class ArchiveStyleReport:
    """What one style contributed (also in ``manifest.json``)."""

    package: str
    version: str
    family: str
    look: str
    licence: str  # the artwork's (Iconify info.json; the package's own for svgmoji, see LICENSES.md)
    package_licence: str  # package.json
    emoji: int = 0
    per_class: dict[str, int] | None = None
    unmapped: int = 0  # icons no source maps to an emoji code
    other_class: int = 0  # icons of an emoji whose class is not one of ``classes`` (or not in emoji.json)
    failed: int = 0  # icons that did not render


def _render_svg(svg: str, size: int) -> Image.Image:
    import cairosvg  # heavy import, only needed here

    try:
        png = cairosvg.svg2png(bytestring=svg.encode("utf-8"), output_width=size, output_height=size)
    except Exception as e:  # cairosvg raises many kinds of parse errors
        raise ImageDecodeError(f"SVG could not be rendered: {e}") from e
    if not isinstance(png, bytes):
        raise ImageDecodeError("SVG rendering produced no PNG")
    return letterbox(open_image(png), size)


def _artwork(style: ArchiveStyle, package: Path, index: NameIndex) -> tuple[dict[str, str], int, str]:
    """normalised code → SVG document, the number of unmapped icons, and the artwork licence."""
    if style.kind == "svgmoji":
        svgs = read_svgmoji_sprite(package / "sprites" / "all.svg")
        return svgs, 0, "Apache-2.0 (Noto Emoji artwork; package code MIT)"
    icon_set = read_iconify(package)
    codes = codes_of(icon_set, index)
    return {c: icon_set.icons[n].svg() for c, n in codes.items()}, len(icon_set.icons) - len(codes), icon_set.licence


def _licences(reports: Mapping[str, ArchiveStyleReport], infos: Mapping[str, Mapping[str, Any]]) -> str:
    lines = ["# Licences of this emoji archive", "",
             "Built by `t3ar data archive` from these npm packages; class labels come from emoji-datasource's",
             "`emoji.json`. Every image here is a PNG rendering (an adaptation) of the package's SVG artwork.", ""]
    for name, r in reports.items():
        info = infos.get(name, {})
        author = info.get("author") or {}
        lic = info.get("license") or {}
        lines += [f"## {name}: {r.package} {r.version}", "",
                  f"- Artwork family: {r.family}; look: {r.look}",
                  f"- Package licence (package.json): {r.package_licence}",
                  f"- Artwork licence: {r.licence}" + (f" ({lic['url']})" if isinstance(lic, dict) and
                                                       lic.get("url") else "")]
        if isinstance(author, dict) and author.get("name"):
            lines.append(f"- Attribution: {info.get('name', name)} by {author['name']}"
                         + (f" ({author['url']})" if author.get("url") else "") + f", licensed {r.licence}.")
        if "SA" in r.licence:
            lines.append("- Share-alike: these renders are adaptations; share them under the same licence.")
        lines.append("")
    return "\n".join(lines)


def build_archive(
    out: Path,
    *,
    cache: Path,
    styles: Sequence[str] = DEFAULT_ARCHIVE,
    classes: Sequence[str] | None = None,
    label: Literal["subcategory", "category"] = "subcategory",
    size: int = 64,
    progress: bool = False,
    package_dirs: Mapping[str, Path] | None = None,
) -> dict[str, Any]:
    """Build (or reuse) the archive in ``out`` (layout in the module docstring); return its manifest report.

    ``classes``: the class slugs to keep (the emoji kit's, so that archive labels are the task's classes);
    None keeps every class of emoji.json. ``package_dirs`` maps npm package names to extracted ``package/``
    folders (skips ``npm pack``). Idempotent: a manifest recording the same request is returned as is
    (``reused`` true, ``seconds`` this call's, ``built_seconds`` the build's). Built in a temporary sibling
    renamed into place, so ``out`` is never half-written.
    Raises InvalidInputError for unknown styles or bad sizes, ToolMissingError when ``npm pack`` fails.
    """
    start = time.monotonic()
    styles = list(dict.fromkeys(styles))
    unknown = [s for s in styles if s not in ARCHIVE_STYLES]
    if unknown or not styles:
        raise InvalidInputError(f"unknown archive styles {unknown}; choose from {', '.join(ARCHIVE_STYLES)}")
    if size <= 0 or label not in ("subcategory", "category"):
        raise InvalidInputError(f"size must be positive and label subcategory or category ({size}, {label!r})")
    keep = None if classes is None else sorted(set(classes))
    request = {"styles": styles, "classes": keep, "label": label, "size": size,
               "packages": {s: f"{ARCHIVE_STYLES[s].package}@{ARCHIVE_STYLES[s].version}" for s in styles}}
    out = Path(out)
    previous = read_manifest(out, KIND)
    if previous is not None and previous.get("request") == request:
        logger.info("emoji archive in %s is up to date", out)
        return previous["report"] | {"reused": True, "seconds": round(time.monotonic() - start, 3),
                                     "built_seconds": previous["report"]["seconds"]}

    given = dict(package_dirs or {})

    def fetch(name: str, version: str) -> Path:
        return Path(given[name]) if name in given else fetch_npm_package(name, version, cache)

    meta = fetch(_META_PACKAGE, KIT_PACKAGES[_META_PACKAGE])
    entries = json.loads((meta / "emoji.json").read_text(encoding="utf-8"))
    label_of = {norm_code(str(e["unified"])): slug(str(e.get(label) or "unlabelled")) for e in entries
                if e.get("unified")}
    file_of = {norm_code(str(e["unified"])): str(e["unified"]).lower() for e in entries if e.get("unified")}
    dirs = {s: fetch(ARCHIVE_STYLES[s].package, ARCHIVE_STYLES[s].version)
            for s in dict.fromkeys([*NAME_SOURCES, *styles])}
    index = NameIndex([read_iconify(dirs[s]).chars for s in NAME_SOURCES], entries)

    reports: dict[str, ArchiveStyleReport] = {}
    infos: dict[str, dict[str, Any]] = {}
    with atomic_output(out) as tmp:
        for s in styles:
            st = ARCHIVE_STYLES[s]
            svgs, unmapped, licence = _artwork(st, dirs[s], index)
            infos[s] = json.loads((dirs[s] / "info.json").read_text()) if (dirs[s] / "info.json").is_file() else {}
            r = ArchiveStyleReport(st.package, st.version, st.family, st.look, licence,
                                   npm_package_info(dirs[s])["license"], unmapped=unmapped)
            chosen = {c: label_of[c] for c in svgs if c in label_of and (keep is None or label_of[c] in keep)}
            r.other_class = len(svgs) - len(chosen)
            items: Any = sorted(chosen.items())
            if progress:
                from tqdm import tqdm

                items = tqdm(items, desc=f"rendering {s}", unit="emoji")
            per_class: Counter[str] = Counter()
            for code, cls in items:
                try:
                    img = _render_svg(svgs[code], size)
                except ImageDecodeError as e:
                    r.failed += 1
                    logger.debug("%s %s: %s", s, code, e)
                    continue
                (tmp / s / cls).mkdir(parents=True, exist_ok=True)
                img.save(tmp / s / cls / f"{file_of[code]}.png", format="PNG")
                per_class[cls] += 1
            r.emoji, r.per_class = sum(per_class.values()), dict(sorted(per_class.items()))
            reports[s] = r
            logger.info("archive style %s: %d emoji in %d classes (%d unmapped icons, %d of other classes, "
                        "%d failed)", s, r.emoji, len(per_class), unmapped, r.other_class, r.failed)
        report = {"styles": {s: vars(r) for s, r in reports.items()}, "size": size, "label": label,
                  "classes": keep, "n_images": sum(r.emoji for r in reports.values()),
                  "seconds": round(time.monotonic() - start, 3), "reused": False}
        (tmp / "LICENSES.md").write_text(_licences(reports, infos), encoding="utf-8")
        write_json(tmp / "manifest.json", {"kind": KIND, "request": request, "report": report})
    logger.info("emoji archive: %d images in %d styles in %s", report["n_images"], len(styles), out)
    return report

"""A large store of unrelated packaged images: every icon of many Iconify icon sets (npm ``@iconify-json/*``),
rendered to PNG (issue 52, item 3: pools that look like a team's, where the few items that matter for a target must
be found among many that do not).

Output layout (``build_icons``)::

    <out>/<set>/<icon name>.png   RGB on white, size x size (letterboxed), unique by content across the store
    <out>/LICENSES.md, <out>/manifest.json

Only sets whose artwork licence allows reuse with attribution or less are listed (:data:`ICON_SETS`; each set's
own ``info.json`` licence is written to LICENSES.md). No emoji sets here: emoji are the benchmark's *relevant*
items, and which of them enter a pool is the pool builder's decision. Monochrome icons are drawn black
(``currentColor``). Idempotent and atomic like the other kits: the same request reuses the store.
"""

from __future__ import annotations

import hashlib
import logging
import random
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from t3ar.data.images import letterbox, open_image
from t3ar.datakit.common import KitReport, atomic_output, fetch_npm_package, npm_package_info, read_manifest, slug
from t3ar.datakit.iconify import read_iconify
from t3ar.errors import ImageDecodeError, InvalidInputError

logger = logging.getLogger(__name__)

KIND = "t3ar-icon-store"

#: icon sets (npm ``@iconify-json/<name>`` at this version) with permissive artwork licences; ~110,000 icons in all
ICON_SETS: dict[str, str] = {
    "material-symbols": "1.2.93", "fluent": "1.2.60", "ic": "1.2.4", "ph": "1.2.2", "mdi": "1.2.3",
    "solar": "1.2.13", "tabler": "1.2.41", "hugeicons": "1.2.35", "game-icons": "1.2.4", "mingcute": "1.2.8",
    "ri": "1.2.10", "icon-park-outline": "1.2.4", "carbon": "1.2.29", "tdesign": "1.2.19", "lucide": "1.2.137",
    "iconoir": "1.2.11", "fa6-solid": "1.2.4", "uil": "1.2.3", "line-md": "1.2.16",
}


@dataclass
class SetStats:
    version: str
    licence: str
    icons: int = 0
    written: int = 0
    duplicates: int = 0
    failed: int = 0


@dataclass
class IconStoreReport(KitReport):
    """What :func:`build_icon_store` produced (also what ``manifest.json`` records)."""

    sets: dict[str, SetStats] = field(default_factory=dict)


def _render(job: tuple[str, str, int]) -> tuple[str, bytes | None]:
    """(name, PNG bytes of the letterboxed RGB rendering) or (name, None) when the SVG does not render."""
    import io

    import cairosvg

    name, svg, size = job
    try:
        png = cairosvg.svg2png(bytestring=svg.encode("utf-8"), output_width=size, output_height=size)
        if not isinstance(png, bytes):
            return name, None
        img = letterbox(open_image(png), size)
    except (ImageDecodeError, Exception):  # cairosvg raises many kinds of parse errors
        return name, None
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return name, buf.getvalue()


def build_icons(out: Path, *, cache: Path, sets: Mapping[str, str] | None = None, size: int = 64,
                max_per_set: int | None = None, seed: int = 0, workers: int = 1,
                packages: Mapping[str, Path] | None = None) -> IconStoreReport:
    """Build (or reuse) the icon store in ``out``: each of ``sets`` (name -> version, default :data:`ICON_SETS`)
    fetched with ``npm pack`` into ``<cache>/npm`` (``packages``: name -> an extracted package folder instead),
    every icon rendered at ``size`` (``max_per_set``: a ``seed``-ed random choice of that many per set), in
    ``workers`` processes. Raises InvalidInputError, ToolMissingError."""
    start = time.monotonic()
    chosen = dict(sets if sets is not None else ICON_SETS)
    if not chosen:
        raise InvalidInputError("no icon sets to build")
    if size <= 0 or (max_per_set is not None and max_per_set <= 0) or workers <= 0:
        raise InvalidInputError(f"size, max_per_set and workers must be positive, got {size}, {max_per_set}, "
                                f"{workers}")
    out = Path(out)
    request = {"sets": dict(sorted(chosen.items())), "size": size, "max_per_set": max_per_set, "seed": seed}
    previous = read_manifest(out, KIND)
    if previous is not None and previous.get("request") == request:
        logger.info("icon store in %s is up to date", out)
        kept = {k: SetStats(**v) for k, v in previous["report"]["sets"].items()}
        return IconStoreReport(out, size, previous["report"]["total"], kept, reused=True,
                               seconds=round(time.monotonic() - start, 3))
    report = IconStoreReport(out, size, 0)
    seen: set[str] = set()
    licences = ["# Licences of this icon store", "", "Built by `t3ar_bench` from these npm packages (Iconify JSON);",
                "every image is a PNG rendering (an adaptation) of the set's SVG artwork.", ""]
    with atomic_output(out) as tmp, ProcessPoolExecutor(max_workers=workers) as pool:
        for name, version in sorted(chosen.items()):
            package = (packages or {}).get(name) or fetch_npm_package(f"@iconify-json/{name}", version, cache)
            icon_set = read_iconify(package)
            info = npm_package_info(package)
            stats = SetStats(version=version, licence=icon_set.licence, icons=len(icon_set.icons))
            report.sets[name] = stats
            names = sorted(icon_set.icons)
            if max_per_set is not None and len(names) > max_per_set:
                names = sorted(random.Random(f"{seed}:{name}").sample(names, max_per_set))
            dest = tmp / name
            dest.mkdir(parents=True, exist_ok=True)
            jobs = [(n, icon_set.icons[n].svg(), size) for n in names]
            for icon, png in pool.map(_render, jobs, chunksize=64):
                if png is None:
                    stats.failed += 1
                    continue
                digest = hashlib.sha256(png).hexdigest()
                if digest in seen:
                    stats.duplicates += 1
                    continue
                seen.add(digest)
                target = dest / f"{slug(icon)}.png"
                if target.exists():  # two names with the same slug
                    target = dest / f"{target.stem}-{digest[:8]}.png"
                target.write_bytes(png)
                stats.written += 1
            author = icon_set.info.get("author") or {}
            licences += [f"## {name}: npm @iconify-json/{name} {version}", "",
                         f"Artwork: {icon_set.info.get('name', name)}"
                         + (f" by {author.get('name')}" if isinstance(author, dict) and author.get("name") else "")
                         + f", licence {icon_set.licence}; package licence {info.get('license', '?')}.", ""]
            logger.info("icon set %s: %d of %d icons written (%d duplicates, %d failed)", name, stats.written,
                        stats.icons, stats.duplicates, stats.failed)
        report.total = sum(s.written for s in report.sets.values())
        report.seconds = round(time.monotonic() - start, 3)
        (tmp / "LICENSES.md").write_text("\n".join(licences), encoding="utf-8")
        report.write_manifest(tmp / "manifest.json", KIND, request)
    logger.info("icon store: %d images from %d sets in %.0f s", report.total, len(report.sets), report.seconds)
    return report


def set_names(sets: Sequence[str] | None = None) -> list[str]:
    """The icon set names a request names (all of :data:`ICON_SETS` for None); InvalidInputError for an unknown
    one."""
    names = list(sets) if sets is not None else list(ICON_SETS)
    unknown = [s for s in names if s not in ICON_SETS]
    if unknown:
        raise InvalidInputError(f"unknown icon sets {unknown}; choose from {', '.join(ICON_SETS)}")
    return names

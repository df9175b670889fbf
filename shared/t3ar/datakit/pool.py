"""The auxiliary-pool data kit: heterogeneous unlabelled images from Debian packages (plus optional emoji).

Output layout (``build_pool``)::

    <out>/<source>/<sha256-prefix>.png   RGB on white, size×size, unique by content across the pool
    <out>/<extra>/<name>.png             extra emoji folders, copied flat (same normalisation)
    <out>/LICENSES.md, <out>/manifest.json

Images are *letterboxed* (whole image fitted on a white square, aspect kept) rather than centre-cropped:
cliparts and stamps are single objects of any aspect ratio and a crop would cut them. The content hash is
taken over the normalised pixels, so the same picture at two source sizes is stored once.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from t3ar.data.images import IMAGE_SUFFIXES, letterbox, open_image, pixel_digest
from t3ar.datakit.common import KitReport, atomic_output, deb_version, fetch_deb, read_manifest
from t3ar.errors import ImageDecodeError, InvalidInputError

logger = logging.getLogger(__name__)

KIND = "t3ar-pool-kit"
MAX_SOURCE_PIXELS = 40_000_000


@dataclass(frozen=True)
class _Source:
    package: str
    folder: str  # inside the unpacked package
    licence: str


SOURCES: dict[str, _Source] = {
    "openclipart": _Source(
        "openclipart-png", "usr/share/openclipart",
        "Public domain (Creative Commons Public Domain Dedication / Certification, per the Debian copyright "
        "file); no attribution required.",
    ),
    "tuxpaint": _Source(
        "tuxpaint-stamps-default", "usr/share/tuxpaint/stamps",
        "As stated by the Debian copyright file (summary below).",
    ),
}
_SUFFIXES = frozenset({".png", ".jpg", ".jpeg"})
_SOURCE_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
_DEP5_FIELDS = re.compile(r"^(Upstream-Name|Source|Files|Copyright|License):")


@dataclass
class SourceStats:
    """Per-source counts: candidate files seen, images written, skipped (unreadable/oversized), duplicates."""

    candidates: int = 0
    written: int = 0
    skipped: int = 0
    duplicates: int = 0
    package: str = ""
    version: str = ""


@dataclass
class PoolKitReport(KitReport):
    """What :func:`build_pool` produced (also what ``manifest.json`` records)."""

    sources: dict[str, SourceStats] = field(default_factory=dict)


def _walk(root: Path, suffixes: Iterable[str]) -> list[Path]:
    """Regular files with ``suffixes`` under ``root``; symlinks are skipped (openclipart links ~1,200 files
    into several categories: same picture, and a link could point outside the package)."""
    allowed = frozenset(suffixes)
    return sorted(
        (
            p
            for p in root.rglob("*")
            if p.suffix.lower() in allowed and not p.is_symlink() and p.is_file() and p.name[0] != "."
        ),
        key=lambda p: p.relative_to(root).as_posix(),
    )


def _copyright_summary(root: Path, package: str) -> list[str]:
    """The DEP-5 header lines (Files/Copyright/License...) of the package's copyright file, or its opening."""
    path = root / "usr/share/doc" / package / "copyright"
    try:
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return [f"(no copyright file at /usr/share/doc/{package}/copyright)"]
    if not text or not text[0].startswith("Format:"):  # not machine-readable (DEP-5): quote its opening
        return [line.rstrip() for line in text[:24]]
    summary: list[str] = []
    in_copyright = False
    for line in text:
        if _DEP5_FIELDS.match(line):
            if not summary or summary[-1] != line.rstrip():
                summary.append(line.rstrip())
            in_copyright = line.startswith("Copyright:")
        elif in_copyright and line.startswith((" ", "\t")) and line.strip() != ".":
            summary.append(line.rstrip())
        else:
            in_copyright = False
    return summary


def _kit_licence(folder: Path) -> list[str]:
    """The LICENSES.md of the kit an extra folder came from (in it or its parent), headings demoted."""
    for candidate in (folder / "LICENSES.md", folder.parent / "LICENSES.md"):
        if candidate.is_file():
            return [re.sub(r"^#", "###", line) for line in candidate.read_text(encoding="utf-8").splitlines()]
    return ["Licence unknown: check where these images came from before sharing the pool."]


def _hash_name(path: Path, digest: str) -> str:
    return digest[:16]


def _stem_name(path: Path, digest: str) -> str:
    return path.stem


def _add_images(
    files: Sequence[Path],
    dest: Path,
    name_of: Callable[[Path, str], str],
    stats: SourceStats,
    seen: set[str],
    *,
    size: int,
    max_items: int | None,
    max_bytes: int,
    rng: random.Random | None,
    progress: bool,
) -> None:
    """Normalise ``files`` into ``dest`` until ``max_items`` are written, named ``name_of(path, sha)``."""
    order: Iterable[Path] = list(files)
    if rng is not None:
        rng.shuffle(order)  # type: ignore[arg-type]
    if progress:
        from tqdm import tqdm

        order = tqdm(order, total=len(files), desc=f"pool {dest.name}", unit="file")
    problems: list[str] = []
    dest.mkdir(parents=True, exist_ok=True)
    for path in order:
        if max_items is not None and stats.written >= max_items:
            break
        try:
            if path.stat().st_size > max_bytes:
                raise ImageDecodeError(f"{path}: {path.stat().st_size} bytes > max_source_bytes {max_bytes}")
            img = letterbox(open_image(path, max_pixels=MAX_SOURCE_PIXELS), size)
        except (ImageDecodeError, OSError) as e:
            stats.skipped += 1
            problems.append(str(e))
            continue
        digest = pixel_digest(img, size)  # img is size x size already: the sha256 of its pixels
        if digest in seen:
            stats.duplicates += 1
            continue
        seen.add(digest)
        target = dest / f"{name_of(path, digest)}.png"
        if target.exists():  # two extra files with the same stem but different content
            target = dest / f"{target.stem}-{digest[:8]}.png"
        img.save(target, format="PNG")
        stats.written += 1
    if problems:
        logger.warning(
            "%s: skipped %d unreadable or oversized files (first: %s)", dest.name, len(problems), problems[0]
        )


def build_pool(
    out: Path,
    *,
    cache: Path,
    sources: Sequence[str] = ("openclipart", "tuxpaint"),
    extra_emoji: Mapping[str, Path] | None = None,
    size: int = 64,
    max_items: int | None = None,
    max_source_bytes: int = 20 * 1024**2,
    seed: int = 0,
    progress: bool = False,
    deb_dirs: Mapping[str, Path] | None = None,
) -> PoolKitReport:
    """Build (or reuse) an unlabelled pool in ``out``; see the module docstring for the layout.

    ``sources`` are keys of :data:`SOURCES` (fetched with ``apt-get download`` into ``<cache>/deb``, a .deb
    already there is reused); ``deb_dirs`` maps Debian package names to already unpacked roots instead.
    ``extra_emoji`` maps a source name to a folder of images (e.g. one style of the emoji kit). PNG/JPEG only
    (SVG stamps are skipped); files over ``max_source_bytes`` or 40 MPix and unreadable files are skipped and
    counted. ``max_items`` caps each source with a ``seed``-ed random choice. Idempotent and atomic like
    :func:`~t3ar.datakit.emoji.build_emoji`. Raises InvalidInputError, ToolMissingError.
    """
    start = time.monotonic()
    sources = list(dict.fromkeys(sources))
    extras = {k: Path(v) for k, v in (extra_emoji or {}).items()}
    unknown = [s for s in sources if s not in SOURCES]
    if unknown:
        raise InvalidInputError(f"unknown pool sources {unknown}; choose from {', '.join(SOURCES)}")
    for name, folder in extras.items():
        if not _SOURCE_NAME.match(name) or name in SOURCES:
            raise InvalidInputError(f"extra source name {name!r}: use a lower-case slug, not {list(SOURCES)}")
        if not folder.is_dir():
            raise InvalidInputError(f"extra source {name}: {folder} is not a directory")
    if not sources and not extras:
        raise InvalidInputError("nothing to build: give at least one source or extra emoji folder")
    if size <= 0 or (max_items is not None and max_items <= 0):
        raise InvalidInputError(f"size and max_items must be positive, got {size}, {max_items}")
    out = Path(out)
    request = {
        "sources": sources, "extra_emoji": {k: str(v.resolve()) for k, v in sorted(extras.items())},
        "size": size, "max_items": max_items, "max_source_bytes": max_source_bytes, "seed": seed,
    }
    previous = read_manifest(out, KIND)
    if previous is not None and previous.get("request") == request:
        logger.info("pool kit in %s is up to date", out)
        kept = {k: SourceStats(**v) for k, v in previous["report"]["sources"].items()}
        seconds = round(time.monotonic() - start, 3)
        return PoolKitReport(out, size, previous["report"]["total"], kept, reused=True, seconds=seconds)

    given = {k: Path(v) for k, v in (deb_dirs or {}).items()}
    roots = {s: given.get(SOURCES[s].package) or fetch_deb(SOURCES[s].package, cache) for s in sources}
    report = PoolKitReport(out, size, 0)
    seen: set[str] = set()
    licences = ["# Licences of this image pool", "", "Built by `t3ar data pool`.", ""]
    with atomic_output(out) as tmp:
        jobs: list[tuple[str, Path, list[Path]]] = []
        for s in sources:
            src = SOURCES[s]
            stats = SourceStats(package=src.package, version=deb_version(roots[s], src.package))
            report.sources[s] = stats
            jobs.append((s, roots[s] / src.folder, _walk(roots[s] / src.folder, _SUFFIXES)))
            licences += [f"## {s}: Debian package {src.package} {stats.version}", "", src.licence, "", "```"]
            licences += _copyright_summary(roots[s], src.package) + ["```", ""]
        for name, folder in sorted(extras.items()):
            report.sources[name] = SourceStats(package=str(folder), version="")
            jobs.append((name, folder, [p for p in _walk(folder, IMAGE_SUFFIXES)]))
            licences += [f"## {name}: images from {folder}", "", *_kit_licence(folder), ""]
        for name, folder, files in jobs:
            stats = report.sources[name]
            stats.candidates = len(files)
            logger.info("pool source %s: %d candidate files under %s", name, len(files), folder)
            _add_images(
                files, tmp / name, _stem_name if name in extras else _hash_name, stats, seen,
                size=size, max_items=max_items, max_bytes=max_source_bytes, progress=progress,
                rng=random.Random(f"{seed}:{name}") if max_items is not None else None,
            )
        report.total = sum(s.written for s in report.sources.values())
        report.seconds = round(time.monotonic() - start, 3)
        (tmp / "LICENSES.md").write_text("\n".join(licences), encoding="utf-8")
        report.write_manifest(tmp / "manifest.json", KIND, request)
    logger.info("pool kit: %d images from %d sources in %s", report.total, len(report.sources), out)
    return report

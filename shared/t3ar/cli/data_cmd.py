"""``t3ar data ...``: build the real offline data kits (emoji styles, auxiliary pool).

The group is wired into the ``t3ar`` CLI by :mod:`t3ar.cli.main`. Domain errors become
``click.ClickException`` (exit code 1, message only, no traceback).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from t3ar.errors import T3arError

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


def _default_cache() -> str:
    return os.environ.get("T3AR_CACHE_DIR") or str(Path.home() / ".cache" / "t3ar")


def _cache_option(func: F) -> F:
    return click.option(
        "--cache",
        type=click.Path(file_okay=False, path_type=Path),
        default=_default_cache,
        show_default="$T3AR_CACHE_DIR or ~/.cache/t3ar",
        help="Where downloaded packages are kept and reused.",
    )(func)


def _split(value: str, choices: tuple[str, ...], what: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in choices]
    if bad or not items:
        raise click.BadParameter(f"unknown {what} {bad or value!r}; choose from {','.join(choices)}")
    return items


def _emit(report: dict[str, Any], as_json: bool, summary: str) -> None:
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(summary)


@click.group("data")
def data() -> None:
    """Build the real offline data sets (from npm / Debian packages) used by demos and benchmarks."""


@data.command("emoji")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path), help="Output folder.")
@_cache_option
@click.option("--styles", default="google,twitter,openmoji,openmoji-black,fluent3d", show_default=True,
              help="Comma-separated styles to build (emoji present in all of them are kept).")
@click.option("--label", type=click.Choice(["subcategory", "category"]), default="subcategory",
              show_default=True, help="Which emoji-datasource field is the class.")
@click.option("--size", type=click.IntRange(min=8, max=1024), default=64, show_default=True,
              help="Output side in pixels.")
@click.option("--min-per-class", type=click.IntRange(min=1), default=2, show_default=True,
              help="Drop classes with fewer emoji (so stratified splits work).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
def emoji_cmd(
    out: Path, cache: Path, styles: str, label: str, size: int, min_per_class: int, as_json: bool
) -> None:
    """Build the emoji style-shift data set: OUT/<style>/<class>/<unified>.png.

    \b
    Fetches emoji-datasource-google/-twitter 16.0.0, openmoji 17.0.0 and
    @lobehub/fluent-emoji-3d 1.1.0 with `npm pack` (needs npm), keeps the emoji
    present in every style, writes RGB PNGs on white plus LICENSES.md and
    manifest.json. Re-running with the same options reuses the existing output.

    \b
    Example:
      t3ar data emoji --out data/emoji --styles google,openmoji --json
    """
    from t3ar.datakit.emoji import ALL_STYLES, build_emoji

    chosen = _split(styles, ALL_STYLES, "styles")
    try:
        report = build_emoji(out, cache=cache, styles=chosen, label=label,  # type: ignore[arg-type]
                             size=size, min_per_class=min_per_class, progress=sys.stderr.isatty())
    except T3arError as e:
        raise click.ClickException(str(e)) from e
    verb = "reused" if report.reused else "built"
    summary = (
        f"{verb} {out}: {report.n_emoji} emoji x {len(report.styles)} styles "
        f"({', '.join(report.styles)}), {report.n_classes} {report.label} classes"
        + (f", dropped {len(report.dropped_classes)} small classes" if report.dropped_classes else "")
        + f" in {report.seconds:.1f}s"
    )
    _emit(report.to_dict(), as_json, summary)


def _parse_extra(values: tuple[str, ...]) -> dict[str, Path]:
    extras: dict[str, Path] = {}
    for value in values:
        name, sep, folder = value.partition("=")
        if not sep or not name or not folder:
            raise click.BadParameter(f"{value!r}: expected STYLE=DIR", param_hint="--with-emoji")
        extras[name.strip()] = Path(folder.strip())
    return extras


@data.command("pool")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path), help="Output folder.")
@_cache_option
@click.option("--sources", default="openclipart,tuxpaint", show_default=True,
              help="Comma-separated Debian-packaged sources.")
@click.option("--max-items", type=click.IntRange(min=1), default=None,
              help="Cap per source (seeded random choice); default: everything.")
@click.option("--size", type=click.IntRange(min=8, max=1024), default=64, show_default=True,
              help="Output side in pixels.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the --max-items choice.")
@click.option("--with-emoji", "with_emoji", multiple=True, metavar="STYLE=DIR",
              help="Also add a folder of emoji images as source STYLE (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
def pool_cmd(
    out: Path, cache: Path, sources: str, max_items: int | None, size: int, seed: int,
    with_emoji: tuple[str, ...], as_json: bool,
) -> None:
    """Build an unlabelled auxiliary pool: OUT/<source>/<hash>.png.

    \b
    Fetches the Debian packages openclipart-png and tuxpaint-stamps-default with
    `apt-get download` (a .deb already in the cache is reused), fits every PNG/JPEG
    on a white square, skips unreadable or huge files, de-duplicates by content,
    and writes LICENSES.md and manifest.json. Leftover emoji styles make good
    pool material: add them with --with-emoji.

    \b
    Example:
      t3ar data pool --out data/pool --max-items 500 \\
          --with-emoji openmoji=data/emoji/openmoji
    """
    from t3ar.datakit.pool import SOURCES, build_pool

    chosen = _split(sources, tuple(SOURCES), "sources")
    extras = _parse_extra(with_emoji)
    try:
        report = build_pool(out, cache=cache, sources=chosen, extra_emoji=extras, size=size,
                            max_items=max_items, seed=seed, progress=sys.stderr.isatty())
    except T3arError as e:
        raise click.ClickException(str(e)) from e
    parts = ", ".join(
        f"{k} {v.written} (skipped {v.skipped}, duplicates {v.duplicates})" for k, v in report.sources.items()
    )
    verb = "reused" if report.reused else "built"
    summary = f"{verb} {out}: {report.total} images: {parts} in {report.seconds:.1f}s"
    _emit(report.to_dict(), as_json, summary)


def _kit_classes(kit: Path | None) -> list[str] | None:
    if kit is None:
        return None
    try:
        classes = json.loads((kit / "manifest.json").read_text(encoding="utf-8"))["report"]["classes"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise click.BadParameter(f"{kit}: not an emoji kit (no manifest.json with classes): {e}",
                                 param_hint="--classes-from") from e
    return [str(c) for c in classes]


@data.command("archive")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path), help="Output folder.")
@_cache_option
@click.option("--styles", default=None, help="Comma-separated archive styles (default: all but noto-svgmoji, an "
              "older copy of noto).")
@click.option("--classes-from", "kit", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              help="An emoji kit built by `t3ar data emoji`: keep only its classes (default: every class).")
@click.option("--label", type=click.Choice(["subcategory", "category"]), default="subcategory",
              show_default=True, help="Which emoji-datasource field is the class.")
@click.option("--size", type=click.IntRange(min=8, max=1024), default=64, show_default=True,
              help="Output side in pixels.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
def archive_cmd(out: Path, cache: Path, styles: str | None, kit: Path | None, label: str, size: int,
                as_json: bool) -> None:
    """Build a labelled archive of many emoji styles: OUT/<style>/<class>/<unified>.png.

    \b
    Fetches @iconify-json/{noto,noto-v1,emojione,emojione-monotone,emojione-v1,
    fxemoji,streamline-emojis,fluent-emoji,fluent-emoji-flat,
    fluent-emoji-high-contrast,twemoji,openmoji} (and @svgmoji/noto on request)
    with `npm pack` (pinned versions), maps icon names to emoji codes, keeps every
    emoji whose class is kept (styles need not share emoji), renders the SVGs
    with cairosvg, and writes LICENSES.md and manifest.json (per style: package,
    artwork family, licence, counts per class). Each style folder is a labelled
    pool: `t3ar pool ingest OUT/<style> --labels folders`.

    \b
    Example:
      t3ar data archive --out data/archive --classes-from data/emoji \\
          --styles emojione-monotone,fxemoji --json
    """
    from t3ar.datakit.archive import ARCHIVE_STYLES, DEFAULT_ARCHIVE, build_archive

    chosen = _split(styles, tuple(ARCHIVE_STYLES), "styles") if styles is not None else list(DEFAULT_ARCHIVE)
    try:
        report = build_archive(out, cache=cache, styles=chosen, classes=_kit_classes(kit),
                               label=label, size=size, progress=sys.stderr.isatty())  # type: ignore[arg-type]
    except T3arError as e:
        raise click.ClickException(str(e)) from e
    verb = "reused" if report["reused"] else "built"
    parts = ", ".join(f"{s} {r['emoji']}" for s, r in report["styles"].items())
    _emit(report, as_json, f"{verb} {out}: {report['n_images']} images: {parts} in {report['seconds']:.1f}s")

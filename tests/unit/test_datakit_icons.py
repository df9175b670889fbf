"""The icon store (t3ar.datakit.icons): every icon of a set rendered once, duplicates by content skipped, the
licence recorded, a repeated request reused; an unknown set refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from t3ar.datakit.icons import ICON_SETS, build_icons, set_names
from t3ar.errors import InvalidInputError

SQUARE = '<rect x="2" y="2" width="12" height="12" fill="currentColor"/>'
DOT = '<circle cx="8" cy="8" r="3" fill="currentColor"/>'


def _package(root: Path) -> Path:
    root.mkdir()
    (root / "icons.json").write_text(json.dumps({"prefix": "fake", "width": 16, "height": 16, "icons": {
        "square": {"body": SQUARE}, "dot": {"body": DOT}, "square-again": {"body": SQUARE},
        "hidden": {"body": DOT, "hidden": True}}}))
    (root / "info.json").write_text(json.dumps({"name": "Fake", "license": {"spdx": "MIT"}}))
    (root / "package.json").write_text(json.dumps({"name": "@iconify-json/fake", "version": "1.0.0",
                                                   "license": "MIT"}))
    return root


def test_icons_are_rendered_once_each_and_the_store_is_reused(tmp_path: Path) -> None:
    pkg = _package(tmp_path / "pkg")
    report = build_icons(tmp_path / "store", cache=tmp_path / "cache", sets={"fake": "1.0.0"}, size=24,
                         packages={"fake": pkg})
    stats = report.sets["fake"]
    assert (stats.icons, stats.written, stats.duplicates, stats.failed) == (3, 2, 1, 0) and report.total == 2
    files = sorted(p.name for p in (tmp_path / "store" / "fake").iterdir())
    assert files == ["dot.png", "square.png"]
    img = Image.open(tmp_path / "store" / "fake" / "dot.png")
    assert img.size == (24, 24) and img.mode == "RGB" and img.getpixel((0, 0)) == (255, 255, 255)
    assert img.getpixel((12, 12)) == (0, 0, 0)  # currentColor drawn black on white
    assert "licence MIT" in (tmp_path / "store" / "LICENSES.md").read_text()
    again = build_icons(tmp_path / "store", cache=tmp_path / "cache", sets={"fake": "1.0.0"}, size=24,
                        packages={"fake": pkg})
    assert again.reused and again.total == 2


def test_unknown_sets_and_bad_sizes_are_refused(tmp_path: Path) -> None:
    assert set_names() == list(ICON_SETS)
    with pytest.raises(InvalidInputError, match="unknown icon sets"):
        set_names(["no-such-set"])
    with pytest.raises(InvalidInputError, match="positive"):
        build_icons(tmp_path / "s", cache=tmp_path, sets={"fake": "1"}, size=0)

"""The labelled emoji archive on fake, tiny npm packages (no network): the Iconify and svgmoji readers, the
name -> code mapping, the build, the artwork families and the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from PIL import Image

from t3ar.cli.data_cmd import data
from t3ar.datakit import archive as archive_mod
from t3ar.datakit.archive import ARCHIVE_STYLES, KIT_FAMILIES, NAME_SOURCES, build_archive, family_of
from t3ar.datakit.emoji import ALL_STYLES
from t3ar.datakit.iconify import Icon, NameIndex, codes_of, norm_code, read_iconify, read_svgmoji_sprite
from t3ar.errors import InvalidInputError

# emoji.json of the fake metadata package: (unified, name, short name, subcategory)
EMOJI = [
    ("1F600", "Grinning Face", "grinning", "face-smiling"),
    ("1F601", "Beaming Face", "grin", "face-smiling"),
    ("2764-FE0F", "Red Heart", "heart", "heart"),
    ("23F0", "Alarm Clock", "alarm_clock", "time"),
    ("1F1ED-1F1F7", "Croatia Flag", "flag-hr", "country-flag"),
    ("1F436", "Dog Face", "dog", "animal-mammal"),
]
RED = '<rect x="0" y="0" width="{w}" height="{h}" fill="#ff0000"/>'
LEFT_BLACK = '<rect x="0" y="0" width="{half}" height="{h}" fill="currentColor"/>'


def _pkg(root: Path, name: str, version: str, licence: str) -> Path:
    root.mkdir(parents=True)
    (root / "package.json").write_text(json.dumps({"name": name, "version": version, "license": licence}))
    return root


def _iconify(root: Path, style: str, icons: dict[str, Any], aliases: dict[str, Any] | None = None,
             chars: dict[str, str] | None = None, size: int = 32) -> Path:
    st = ARCHIVE_STYLES[style]
    pkg = _pkg(root / style, st.package, st.version, "CC-BY-4.0")
    (pkg / "icons.json").write_text(json.dumps({"prefix": style, "icons": icons, "aliases": aliases or {},
                                                "width": size, "height": size}))
    (pkg / "info.json").write_text(json.dumps({"name": style.title(), "author": {"name": "Someone", "url": "u"},
                                               "license": {"spdx": "CC-BY-4.0", "url": "https://l"}}))
    if chars is not None:
        (pkg / "chars.json").write_text(json.dumps(chars))
    return pkg


def _body(w: int = 32) -> dict[str, str]:
    return {"body": RED.format(w=w, h=w)}


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("npm")
    meta = _pkg(base / "meta", "emoji-datasource-google", "16.0.0", "MIT")
    (meta / "emoji.json").write_text(json.dumps([
        {"unified": u, "name": n, "short_names": [s], "subcategory": c, "category": "x"} for u, n, s, c in EMOJI]))
    out = {"emoji-datasource-google": meta}
    # the name sources: only "noto" knows names (chars.json); the others are empty sets
    noto_chars = {"1f600": "grinning-face", "1f601": "beaming-face-with-smiling-eyes", "2764-fe0f": "red-heart",
                  "23f0": "alarm-clock", "1f1ed-1f1f7": "flag-croatia", "1f436": "dog-face"}
    out[ARCHIVE_STYLES["noto"].package] = _iconify(base, "noto", {n: _body() for n in noto_chars.values()},
                                                   chars=noto_chars)
    for s in NAME_SOURCES[1:]:
        out[ARCHIVE_STYLES[s].package] = _iconify(base, s, {}, chars={})
    # a set without chars.json: names found via the index (exact, flag-for-, squashed), an alias, a hidden icon,
    # an unknown name, an emoji of a class the archive does not keep, and an SVG cairosvg cannot draw
    out[ARCHIVE_STYLES["emojione"].package] = _iconify(
        base, "emojione",
        {"grinning-face": _body(64), "flag-for-croatia": _body(64), "alarmclock": _body(64),
         "dog-face": {"body": "<rect width='10' <g>"},
         "mystery-blob": _body(64), "old-name": {**_body(64), "hidden": True}},
        aliases={"red-heart": {"parent": "grinning-face"}, "grin": {"parent": "old-name"},
                 "turned": {"parent": "grinning-face", "rotate": 1}}, size=64)
    sprite = base / "svgmoji" / "sprites"
    sprite.mkdir(parents=True)
    (sprite / "all.svg").write_text(
        '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 10 10">'
        '<svg viewBox="0 0 8 8" id="1F600"><rect width="8" height="8" fill="#00ff00"/></svg>'
        '<svg viewBox="0 0 8 8" id="2764-FE0F"><rect width="8" height="8" fill="#0000ff"/></svg></svg>')
    (base / "svgmoji" / "package.json").write_text(json.dumps({"name": "@svgmoji/noto", "version": "3.2.0",
                                                               "license": "MIT"}))
    out["@svgmoji/noto"] = base / "svgmoji"
    return out


def test_norm_code_drops_the_variation_selector_and_unifies_case() -> None:
    assert norm_code("2764-fe0f") == norm_code("2764") == "2764"
    assert norm_code("1f1ed_1f1f7") == "1F1ED-1F1F7"


def test_iconify_reader_resolves_aliases_and_skips_hidden_icons(packages: dict[str, Path]) -> None:
    s = read_iconify(packages[ARCHIVE_STYLES["emojione"].package])
    assert "old-name" not in s.icons and "grin" not in s.icons  # hidden, and an alias of a hidden icon
    assert "turned" not in s.icons  # rotated: not drawn
    assert s.icons["red-heart"].body == s.icons["grinning-face"].body
    assert s.icons["grinning-face"].width == 64 and s.licence == "CC-BY-4.0" and s.chars == {}


def test_iconify_reader_rejects_a_package_without_icons(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="not an Iconify JSON package"):
        read_iconify(tmp_path)


def test_an_alias_transform_is_drawn(tmp_path: Path) -> None:
    """An hFlip alias renders mirrored: the black half moves from the left to the right."""
    plain = Icon(LEFT_BLACK.format(half=16, h=32), 32, 32)
    flipped = Icon(plain.body, 32, 32, h_flip=True)
    a = archive_mod._render_svg(plain.svg(), 32)
    b = archive_mod._render_svg(flipped.svg(), 32)
    assert a.getpixel((4, 16)) == (0, 0, 0) and a.getpixel((28, 16)) == (255, 255, 255)
    assert b.getpixel((4, 16)) == (255, 255, 255) and b.getpixel((28, 16)) == (0, 0, 0)


def test_svgmoji_sprite_reader(packages: dict[str, Path]) -> None:
    svgs = read_svgmoji_sprite(packages["@svgmoji/noto"] / "sprites" / "all.svg")
    assert set(svgs) == {"1F600", "2764"}
    img = archive_mod._render_svg(svgs["2764"], 16)
    assert img.getpixel((8, 8)) == (0, 0, 255)


def test_name_index_trusts_chars_first_and_drops_ambiguous_names() -> None:
    idx = NameIndex([{"heart": "2764"}, {"heart": "2764", "clash": "1F600"}, {"clash": "1F601"}],
                    [{"unified": "1F499", "name": "Heart", "short_names": ["blue_heart"]},
                     {"unified": "23F0", "name": "Alarm Clock", "short_names": []}])
    assert idx.code("heart") == "2764"  # chars.json beats emoji-datasource's "Heart"
    assert idx.code("clash") is None  # two chars.json codes: ambiguous
    assert idx.code("blue-heart") == "1F499" and idx.code("alarmclock") == "23F0"
    assert idx.code("flag-for-nowhere") is None


def test_codes_of_prefers_the_sets_own_chars(packages: dict[str, Path]) -> None:
    noto = read_iconify(packages[ARCHIVE_STYLES["noto"].package])
    idx = NameIndex([], [])
    assert codes_of(noto, idx)["1F600"] == "grinning-face"


def test_build_keeps_mapped_emoji_of_the_kept_classes(packages: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "archive"
    rep = build_archive(out, cache=tmp_path / "cache", styles=["emojione", "noto-svgmoji"],
                        classes=["face-smiling", "heart", "country-flag", "animal-mammal"], size=16,
                        package_dirs=packages)
    files = {str(p.relative_to(out)) for p in out.rglob("*.png")}
    assert files == {
        "emojione/face-smiling/1f600.png", "emojione/heart/2764-fe0f.png",  # the file name as in the emoji kit
        "emojione/country-flag/1f1ed-1f1f7.png",
        "noto-svgmoji/face-smiling/1f600.png", "noto-svgmoji/heart/2764-fe0f.png",
    }
    e = rep["styles"]["emojione"]
    # alarmclock maps (squashed) but its class "time" is not kept; dog-face fails to render; mystery-blob unmapped
    assert (e["emoji"], e["other_class"], e["failed"], e["unmapped"]) == (3, 1, 1, 1)
    assert e["per_class"] == {"country-flag": 1, "face-smiling": 1, "heart": 1}
    assert e["family"] == "emojione" and e["licence"] == "CC-BY-4.0"
    with Image.open(out / "emojione/heart/2764-fe0f.png") as img:
        assert img.size == (16, 16) and img.mode == "RGB"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["report"]["n_images"] == 5 and manifest["request"]["classes"] == sorted(
        ["face-smiling", "heart", "country-flag", "animal-mammal"])
    licences = (out / "LICENSES.md").read_text()
    assert "@iconify-json/emojione 1.2.3" in licences and "Someone" in licences
    again = build_archive(out, cache=tmp_path / "cache", styles=["emojione", "noto-svgmoji"],
                          classes=["face-smiling", "heart", "country-flag", "animal-mammal"], size=16,
                          package_dirs={})  # reused before any package is needed
    assert again["reused"] is True


def test_build_rejects_unknown_styles_and_foreign_folders(packages: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="unknown archive styles"):
        build_archive(tmp_path / "a", cache=tmp_path, styles=["google"], package_dirs=packages)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "mine.txt").write_text("keep")
    with pytest.raises(InvalidInputError, match="not a t3ar-emoji-archive"):
        build_archive(tmp_path / "b", cache=tmp_path, styles=["emojione"], package_dirs=packages)
    assert (tmp_path / "b" / "mine.txt").read_text() == "keep"


def test_every_style_has_a_family_and_no_name_collides() -> None:
    assert set(ALL_STYLES) == set(KIT_FAMILIES)
    assert not set(ARCHIVE_STYLES) & set(ALL_STYLES)
    assert family_of("google") == family_of("noto") == "noto"  # the source's artwork
    assert family_of("twitter") == family_of("twemoji") and family_of("openmoji-black") == family_of(
        "openmoji-iconify")
    assert family_of("fluent3d") == family_of("fluent-emoji-high-contrast")
    with pytest.raises(KeyError):
        family_of("apple")


def test_cli_archive_reuses_and_reports_bad_options(packages: dict[str, Path], tmp_path: Path) -> None:
    kit = tmp_path / "kit"
    kit.mkdir()
    (kit / "manifest.json").write_text(json.dumps({"report": {"classes": ["heart", "face-smiling"]}}))
    out = tmp_path / "archive"
    build_archive(out, cache=tmp_path, styles=["emojione"], classes=["heart", "face-smiling"], size=16,
                  package_dirs=packages)
    runner = CliRunner()
    res = runner.invoke(data, ["archive", "--out", str(out), "--cache", str(tmp_path), "--styles", "emojione",
                               "--classes-from", str(kit), "--size", "16", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["reused"] is True
    bad = runner.invoke(data, ["archive", "--out", str(out), "--styles", "apple"])
    assert bad.exit_code != 0 and "unknown styles" in bad.output
    res = runner.invoke(data, ["archive", "--out", str(out), "--classes-from", str(tmp_path)])
    assert res.exit_code != 0 and "not an emoji kit" in res.output

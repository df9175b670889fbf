"""Emoji and pool data kits on fake, tiny package layouts (no network, no npm/apt)."""

from __future__ import annotations

import gzip
import json
import os
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from PIL import Image

from t3ar.cli.data_cmd import data
from t3ar.datakit import common
from t3ar.datakit.emoji import DEFAULT_STYLES, PACKAGES, build_emoji
from t3ar.datakit.pool import build_pool
from t3ar.errors import InvalidInputError, ToolMissingError

# (unified, subcategory, category); 1F98B has no fluent image, 1F42D's twitter image is corrupt,
# 1F438 is alone in its subcategory (dropped with min_per_class=2).
EMOJI = [
    ("1F600", "face-smiling", "Smileys & Emotion"),
    ("1F601", "face-smiling", "Smileys & Emotion"),
    ("2764-FE0F", "heart", "Smileys & Emotion"),
    ("1F49B", "heart", "Smileys & Emotion"),
    ("1F436", "animal-mammal", "Animals & Nature"),
    ("1F431", "animal-mammal", "Animals & Nature"),
    ("1F438", "animal-amphibian", "Animals & Nature"),
    ("1F98B", "animal-bug", "Animals & Nature"),
    ("1F42D", "animal-mammal", "Animals & Nature"),
]
SVG = (
    "<svg xmlns='http://www.w3.org/2000/svg' width='72' height='72'>"
    "<circle cx='36' cy='36' r='20' fill='{}'/></svg>"
)


def _pkg(root: Path, name: str, version: str, licence: str) -> Path:
    root.mkdir(parents=True)
    (root / "package.json").write_text(json.dumps({"name": name, "version": version, "license": licence}))
    return root


def _rgba(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    img = Image.new("RGBA", (size, size), (0, 0, 0, 0))
    img.paste((250, 200, 0, 255), (size // 4, size // 4, 3 * size // 4, 3 * size // 4))
    img.save(path)


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("npm")
    out: dict[str, Path] = {}
    meta = [
        {"unified": u, "image": u.lower() + ".png", "subcategory": s, "category": c,
         "has_img_google": True, "has_img_twitter": True}
        for u, s, c in EMOJI
    ]
    for style in ("google", "twitter"):
        pkg = _pkg(base / style, f"emoji-datasource-{style}", "16.0.0", "MIT")
        (pkg / "emoji.json").write_text(json.dumps(meta))
        for u, _, _ in EMOJI:
            _rgba(pkg / "img" / style / "64" / f"{u.lower()}.png", 64)
        out[f"emoji-datasource-{style}"] = pkg
    (out["emoji-datasource-twitter"] / "img/twitter/64/1f42d.png").write_bytes(b"\x89PNG\r\n\x1a\nbroken")
    om = _pkg(base / "openmoji", "openmoji", "17.0.0", "CC-BY-SA-4.0")
    for variant, colour in (("color", "red"), ("black", "black")):
        (om / variant / "svg").mkdir(parents=True)
        for u, _, _ in EMOJI:
            name = u.replace("-FE0F", "")  # OpenMoji file names may lack FE0F
            (om / variant / "svg" / f"{name}.svg").write_text(SVG.format(colour))
    out["openmoji"] = om
    fl = _pkg(base / "fluent", "@lobehub/fluent-emoji-3d", "1.1.0", "MIT")
    for u, _, _ in EMOJI:
        if u != "1F98B":
            (fl / "assets").mkdir(exist_ok=True)
            Image.new("RGBA", (256, 256), (0, 120, 255, 255)).save(fl / "assets" / f"{u.lower()}.webp")
    out["@lobehub/fluent-emoji-3d"] = fl
    ff = _pkg(base / "fluentflat", "@lobehub/fluent-emoji-flat", "1.1.0", "MIT")
    (ff / "assets").mkdir()
    for u, _, _ in EMOJI:
        (ff / "assets" / f"{u.lower()}.svg").write_text(SVG.format("green"))
    out["@lobehub/fluent-emoji-flat"] = ff
    return out


def test_build_emoji_layout_report_and_licences(packages: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "emoji"
    report = build_emoji(out, cache=tmp_path / "cache", size=32, package_dirs=packages)
    assert report.classes == ["animal-mammal", "face-smiling", "heart"] and report.n_classes == 3
    assert report.n_emoji == 6 and report.counts == {s: 6 for s in DEFAULT_STYLES}  # the default: not fluentflat
    assert report.dropped_classes == {"animal-amphibian": 1}
    assert report.missing == {"fluent3d": 1}
    assert [f[:2] for f in report.failed] == [["1f42d", "twitter"]]
    for style in DEFAULT_STYLES:
        files = sorted(p.relative_to(out / style).as_posix() for p in (out / style).rglob("*.png"))
        assert files == ["animal-mammal/1f431.png", "animal-mammal/1f436.png", "face-smiling/1f600.png",
                         "face-smiling/1f601.png", "heart/1f49b.png", "heart/2764-fe0f.png"]
    img = Image.open(out / "google" / "heart" / "1f49b.png")
    assert img.mode == "RGB" and img.size == (32, 32) and img.getpixel((0, 0)) == (255, 255, 255)
    assert Image.open(out / "openmoji" / "heart" / "2764-fe0f.png").getpixel((16, 16))[0] > 200
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["report"]["classes"] == report.classes and manifest["request"]["size"] == 32
    licences = (out / "LICENSES.md").read_text()
    for needle in ("Apache License 2.0", "CC-BY 4.0", "CC BY-SA 4.0", "MIT", "openmoji 17.0.0"):
        assert needle in licences
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_the_flat_fluent_style_is_built_by_name(packages: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "emoji"
    report = build_emoji(out, cache=tmp_path / "c", styles=["google", "fluentflat"], size=32, package_dirs=packages)
    assert report.counts == {"google": 7, "fluentflat": 7} and report.styles == ["google", "fluentflat"]
    assert Image.open(out / "fluentflat" / "heart" / "1f49b.png").getpixel((16, 16))[1] > 100  # the green SVG
    assert "@lobehub/fluent-emoji-flat 1.1.0" in (out / "LICENSES.md").read_text()


def test_build_emoji_is_idempotent_and_rebuilds_on_change(packages: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "emoji"
    styles = ["google", "openmoji"]
    first = build_emoji(out, cache=tmp_path / "c", styles=styles, size=16, package_dirs=packages)
    stamp = (out / "manifest.json").stat().st_mtime_ns
    again = build_emoji(out, cache=tmp_path / "c", styles=styles, size=16, package_dirs=packages)
    assert again.reused and again.classes == first.classes and again.n_emoji == first.n_emoji
    assert (out / "manifest.json").stat().st_mtime_ns == stamp
    by_category = build_emoji(out, cache=tmp_path / "c", styles=styles, size=16, label="category",
                              package_dirs=packages)
    assert not by_category.reused and by_category.classes == ["animals-and-nature", "smileys-and-emotion"]
    assert sorted(p.name for p in out.iterdir()) == ["LICENSES.md", "google", "manifest.json", "openmoji"]


def test_build_emoji_refuses_foreign_dir_and_bad_args(packages: dict[str, Path], tmp_path: Path) -> None:
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("precious")
    with pytest.raises(InvalidInputError, match="not a t3ar-emoji-kit"):
        build_emoji(foreign, cache=tmp_path, package_dirs=packages)
    assert (foreign / "thesis.tex").exists()
    with pytest.raises(InvalidInputError, match="unknown emoji styles"):
        build_emoji(tmp_path / "x", cache=tmp_path, styles=["apple"], package_dirs=packages)


def _fake_npm_cache(packages: dict[str, Path], cache: Path) -> None:
    """Put `npm pack`-style tarballs (package/...) where fetch_npm_package looks for them."""
    (cache / "npm").mkdir(parents=True)
    for name, folder in packages.items():
        with tarfile.open(cache / "npm" / common.npm_tarball_name(name, PACKAGES[name]), "w:gz") as tf:
            tf.add(folder, arcname="package")


def test_fetch_reuses_cached_tarball_without_npm(
    packages: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "nobin"))
    cache = tmp_path / "cache"
    _fake_npm_cache(packages, cache)
    pkg = common.fetch_npm_package("@lobehub/fluent-emoji-3d", "1.1.0", cache)
    assert pkg == cache / "npm" / "lobehub-fluent-emoji-3d-1.1.0" / "package"
    assert (pkg / "assets" / "1f600.webp").is_file()
    with pytest.raises(ToolMissingError, match="apt-get install npm"):
        common.fetch_npm_package("left-pad", "1.3.0", cache)


def test_npm_pack_failure_shows_stderr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "npm"
    fake.write_text("#!/bin/sh\necho 'npm error code E404' >&2\necho 'npm error 404 Not Found' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(ToolMissingError, match="(?s)npm pack nope@1.0.0 failed.*404 Not Found"):
        common.fetch_npm_package("nope", "1.0.0", tmp_path / "cache")
    assert not list((tmp_path / "cache" / "npm").iterdir())


def test_cli_emoji_json_and_error_mapping(packages: dict[str, Path], tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _fake_npm_cache(packages, cache)
    runner = CliRunner()
    env = {"T3AR_CACHE_DIR": str(cache), "PATH": str(tmp_path / "nobin")}
    res = runner.invoke(data, ["emoji", "--out", str(tmp_path / "e"), "--styles", "google,fluent3d",
                               "--size", "16", "--json"], env=env)
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["n_emoji"] == 7  # 1F42D is only broken in the twitter style
    res = runner.invoke(data, ["emoji", "--out", str(tmp_path / "e"), "--styles", "google,fluent3d",
                               "--size", "16"], env=env)
    assert res.exit_code == 0 and res.output.startswith("reused")
    res = runner.invoke(data, ["emoji", "--out", str(tmp_path / "f"), "--cache", str(tmp_path / "empty")],
                        env=env)
    assert res.exit_code == 1 and "npm" in res.output and "Traceback" not in res.output
    res = runner.invoke(data, ["emoji", "--out", str(tmp_path / "g"), "--styles", "apple"], env=env)
    assert res.exit_code == 2 and "unknown styles" in res.output
    res = runner.invoke(data, ["pool", "--out", str(tmp_path / "p"), "--with-emoji", "nodir"], env=env)
    assert res.exit_code == 2 and "STYLE=DIR" in res.output


def _deb_root(base: Path, package: str, folder: str, version: str, copyright_text: str) -> Path:
    doc = base / "usr/share/doc" / package
    doc.mkdir(parents=True)
    (doc / "copyright").write_text(copyright_text)
    with gzip.open(doc / "changelog.Debian.gz", "wt") as f:
        f.write(f"{package.split('-')[0]} ({version}) unstable; urgency=medium\n")
    (base / folder).mkdir(parents=True)
    return base / folder


def test_build_pool_sources_extras_and_idempotency(tmp_path: Path) -> None:
    oc = tmp_path / "oc"
    art = _deb_root(oc, "openclipart-png", "usr/share/openclipart/png/animals", "1:0.18-1",
                    "creative commons Public Domain Dedication\n")
    Image.new("RGB", (40, 20), (10, 10, 10)).save(art / "wide.png")
    Image.new("RGB", (40, 20), (10, 10, 10)).save(art / "same-content.jpg", quality=100)
    Image.new("RGB", (30, 30), (0, 200, 0)).save(art / "green.png")
    (art / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n nope")
    (art / "huge.png").write_bytes(b"\0" * 5000)
    (art / "vector.svg").write_text(SVG.format("red"))
    tux = tmp_path / "tux"
    stamps = _deb_root(tux, "tuxpaint-stamps-default", "usr/share/tuxpaint/stamps/animals", "2022.06.04-1",
                       "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n"
                       "Files: *\nCopyright: 2002 Someone\nLicense: GPL-2\n This is long text.\n")
    _rgba(stamps / "cat.png", 50)
    kit = tmp_path / "kit"
    _rgba(kit / "openmoji" / "face" / "1f600.png", 64)
    (kit / "openmoji" / "heart").mkdir(parents=True)
    Image.new("RGB", (64, 64), "blue").save(kit / "openmoji" / "heart" / "2764.png")
    (kit / "LICENSES.md").write_text("# Licences of this emoji data kit\nOpenMoji CC BY-SA 4.0\n")
    out = tmp_path / "pool"
    roots = {"openclipart-png": oc, "tuxpaint-stamps-default": tux}
    report = build_pool(out, cache=tmp_path / "cache", extra_emoji={"openmoji": kit / "openmoji"}, size=24,
                        max_source_bytes=4000, deb_dirs=roots)
    oc_stats, tux_stats, om_stats = (report.sources[k] for k in ("openclipart", "tuxpaint", "openmoji"))
    assert (oc_stats.candidates, oc_stats.written, oc_stats.skipped, oc_stats.duplicates) == (5, 2, 2, 1)
    assert oc_stats.version == "1:0.18-1" and tux_stats.written == 1 and om_stats.written == 2
    assert report.total == 5
    assert sorted(p.name for p in (out / "openmoji").iterdir()) == ["1f600.png", "2764.png"]
    names = [p.stem for p in (out / "openclipart").iterdir()]
    assert all(len(n) == 16 for n in names)
    img = Image.open(out / "tuxpaint" / os.listdir(out / "tuxpaint")[0])
    assert img.size == (24, 24) and img.mode == "RGB" and img.getpixel((0, 0)) == (255, 255, 255)
    licences = (out / "LICENSES.md").read_text()
    assert "Public domain" in licences and "License: GPL-2" in licences and "long text" not in licences
    assert "OpenMoji CC BY-SA 4.0" in licences
    again = build_pool(out, cache=tmp_path / "cache", extra_emoji={"openmoji": kit / "openmoji"}, size=24,
                       max_source_bytes=4000, deb_dirs=roots)
    assert again.reused and again.total == 5
    capped = [build_pool(tmp_path / f"cap{i}", cache=tmp_path / "cache", sources=["openclipart"], size=24,
                         max_items=1, seed=3, deb_dirs=roots) for i in range(2)]
    assert capped[0].total == 1
    assert os.listdir(tmp_path / "cap0" / "openclipart") == os.listdir(tmp_path / "cap1" / "openclipart")


def test_fetch_deb_reuses_cached_deb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "src"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "DEBIAN" / "control").write_text(
        "Package: fake-art\nVersion: 1.0-1\nArchitecture: all\n"
        "Maintainer: t <t@example.org>\nDescription: x\n"
    )
    _rgba(pkg / "usr/share/fake/a.png", 8)
    (tmp_path / "cache" / "deb").mkdir(parents=True)
    deb = tmp_path / "cache" / "deb" / "fake-art_1.0-1_all.deb"
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(pkg), str(deb)], check=True,
                   capture_output=True)
    real_require = common.require_tool

    def no_apt(tool: str, hint: str) -> str:
        assert tool != "apt-get", "must not download when the .deb is cached"
        return real_require(tool, hint)

    monkeypatch.setattr(common, "require_tool", no_apt)
    root = common.fetch_deb("fake-art", tmp_path / "cache")
    assert (root / "usr/share/fake/a.png").is_file()
    assert common.fetch_deb("fake-art", tmp_path / "cache") == root


def test_missing_apt_get_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "nobin"))
    with pytest.raises(ToolMissingError, match="apt-get"):
        build_pool(tmp_path / "p", cache=tmp_path / "cache", sources=["tuxpaint"])


def test_fetch_npm_package_with_a_relative_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """npm runs in a scratch folder: a relative cache path must still land in the right place."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "npm"
    fake.write_text(
        "#!/usr/bin/env python3\n"
        "import io, sys, tarfile\n"
        "dest = sys.argv[sys.argv.index('--pack-destination') + 1]\n"
        "name, version = sys.argv[2].rsplit('@', 1)\n"
        "with tarfile.open(f'{dest}/{name}-{version}.tgz', 'w:gz') as tf:\n"
        "    data = b'{\"name\": \"x\"}'\n"
        "    info = tarfile.TarInfo('package/package.json'); info.size = len(data)\n"
        "    tf.addfile(info, io.BytesIO(data))\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    package = common.fetch_npm_package("fakepkg", "1.0.0", Path("rel-cache"))
    assert (package / "package.json").is_file()
    assert (tmp_path / "rel-cache" / "npm" / "fakepkg-1.0.0.tgz").is_file()

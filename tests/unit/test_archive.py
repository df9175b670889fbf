"""safe_extract: validate every member first, enforce limits while streaming, leave nothing behind."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from t3ar.data.archive import ExtractLimits, archive_kind, safe_extract
from t3ar.errors import InvalidInputError, UnsafeArchiveError


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tf:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _info(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


def _zip(path: Path, files: dict[str, bytes], compression: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", compression) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


DEFAULT = ExtractLimits()


def _assert_rejected(archive: Path, dest: Path, match: str, limits: ExtractLimits = DEFAULT) -> None:
    with pytest.raises(UnsafeArchiveError, match=match):
        safe_extract(archive, dest, limits)
    assert not dest.exists()
    assert [p.name for p in dest.parent.iterdir() if p.name.startswith(f".{dest.name}")] == []


def test_normal_zip_and_tar_gz_extract(tmp_path: Path) -> None:
    files = {
        "set/a/1.png": b"one", "set/b/2.png": b"two", "__MACOSX/set/._1.png": b"junk", "set/.DS_Store": b"x"
    }
    out = safe_extract(_zip(tmp_path / "a.zip", files), tmp_path / "z")
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "set/a/1.png", "set/b/2.png",
    ]
    assert (out / "set/b/2.png").read_bytes() == b"two"
    tgz_dir = _info("d")
    tgz_dir.type = tarfile.DIRTYPE
    tgz = _tar(tmp_path / "b.tar.gz", [(tgz_dir, None), (_info("d/x.txt"), b"hello")])
    assert (safe_extract(tgz, tmp_path / "t") / "d/x.txt").read_bytes() == b"hello"
    (tmp_path / "empty").mkdir()
    assert safe_extract(tgz, tmp_path / "empty") == tmp_path / "empty"


def test_archive_kind_by_content(tmp_path: Path) -> None:
    zipped = _zip(tmp_path / "x.bin", {"a": b"1"})
    assert archive_kind(zipped) == "zip"
    for mode, name in [("w", "p.tar"), ("w:gz", "g.dat"), ("w:bz2", "b.tbz"), ("w:xz", "x.txz")]:
        assert archive_kind(_tar(tmp_path / name, [(_info("a"), b"1")], mode)) == "tar"
    (tmp_path / "fake.zip").write_bytes(b"not an archive at all" * 40)
    assert archive_kind(tmp_path / "fake.zip") is None
    _assert_rejected(tmp_path / "fake.zip", tmp_path / "out", "not a zip or tar")


@pytest.mark.parametrize(
    ("name", "why"),
    [("../x", "traversal"), ("a/../../x", "traversal"), ("/etc/passwd", "absolute"),
     ("C:/win.ini", "absolute"), ("..\\evil.txt", "traversal")],
)
def test_rejects_unsafe_names(tmp_path: Path, name: str, why: str) -> None:
    _assert_rejected(_zip(tmp_path / "bad.zip", {"ok.txt": b"1", name: b"2"}), tmp_path / "z", why)
    tgz = _tar(tmp_path / "bad.tgz", [(_info("ok.txt"), b"1"), (_info(name), b"2")])
    _assert_rejected(tgz, tmp_path / "t", why)


def test_rejects_links_devices_and_duplicates(tmp_path: Path) -> None:
    ok = (_info("ok.txt"), b"1")
    _assert_rejected(_tar(tmp_path / "s.tgz", [ok, (_info("l", tarfile.SYMTYPE, "/etc/passwd"), None)]),
                     tmp_path / "o", "symbolic link")
    _assert_rejected(_tar(tmp_path / "h.tgz", [ok, (_info("h", tarfile.LNKTYPE, "ok.txt"), None)]),
                     tmp_path / "o", "hard link")
    _assert_rejected(_tar(tmp_path / "d.tgz", [ok, (_info("dev", tarfile.CHRTYPE), None)]),
                     tmp_path / "o", "device")
    _assert_rejected(_tar(tmp_path / "dup.tgz", [ok, (_info("./ok.txt"), b"2")]), tmp_path / "o", "duplicate")
    link = zipfile.ZipInfo("link")
    link.external_attr = (0o120777 << 16)
    with zipfile.ZipFile(tmp_path / "s.zip", "w") as zf:
        zf.writestr("ok.txt", b"1")
        zf.writestr(link, "/etc/passwd")
    _assert_rejected(tmp_path / "s.zip", tmp_path / "o", "symbolic link")


def test_limits_on_count_and_declared_size(tmp_path: Path) -> None:
    many = _zip(tmp_path / "many.zip", {f"f{i}.txt": b"x" for i in range(6)})
    _assert_rejected(many, tmp_path / "o", "max_files", ExtractLimits(max_files=5))
    big = _zip(tmp_path / "big.zip", {"a.bin": b"a" * 3000, "b.bin": b"b" * 3000}, zipfile.ZIP_STORED)
    _assert_rejected(big, tmp_path / "o", "max_file_bytes", ExtractLimits(max_file_bytes=2000))
    _assert_rejected(big, tmp_path / "o", "max_total_bytes", ExtractLimits(max_total_bytes=5000))
    # a tar whose header declares a size over the limit is refused before any data is read
    _assert_rejected(_tar(tmp_path / "t.tgz", [(_info("x"), b"y" * 5000)]), tmp_path / "o", "declared size",
                     ExtractLimits(max_file_bytes=4096))


def test_zip_bomb_ratio_rejected(tmp_path: Path) -> None:
    bomb = _zip(tmp_path / "bomb.zip", {"ok.txt": b"1", "zeros.bin": bytes(8 << 20)}, zipfile.ZIP_BZIP2)
    _assert_rejected(bomb, tmp_path / "o", "zip bomb")


def test_lying_declared_size_is_caught_and_rolled_back(tmp_path: Path) -> None:
    path = _zip(tmp_path / "lie.zip", {"a.txt": b"x" * 100}, zipfile.ZIP_STORED)
    raw = bytearray(path.read_bytes())
    # shrink the declared size in the central directory only (offset 24 in the central header)
    cd = raw.rfind(b"PK\x01\x02")
    raw[cd + 24 : cd + 28] = (10).to_bytes(4, "little")
    path.write_bytes(bytes(raw))
    with pytest.raises(UnsafeArchiveError, match="a.txt.*rolled back"):
        safe_extract(path, tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_dest_must_be_new_or_empty(tmp_path: Path) -> None:
    dest = tmp_path / "full"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    with pytest.raises(InvalidInputError, match="not an empty directory"):
        safe_extract(_zip(tmp_path / "a.zip", {"a": b"1"}), dest)
    assert (dest / "keep.txt").read_text() == "mine"


def test_errors_name_the_offending_member(tmp_path: Path) -> None:
    """The member rejected while listing is the one named (not the member before it, nor '?' when first)."""
    _assert_rejected(_zip(tmp_path / "a.zip", {"ok.txt": b"1", "../evil.txt": b"2"}), tmp_path / "o",
                     r"member '\.\./evil\.txt' rejected: '\.\.' path component")
    _assert_rejected(_tar(tmp_path / "a.tgz", [(_info("ok.txt"), b"1"), (_info("l", tarfile.SYMTYPE, "/x"), None)]),
                     tmp_path / "o", "member 'l' rejected: symbolic link")
    bomb = _zip(tmp_path / "bomb.zip", {"zeros.bin": bytes(8 << 20), "ok.txt": b"1"}, zipfile.ZIP_BZIP2)
    _assert_rejected(bomb, tmp_path / "o", "member 'zeros.bin' rejected: compression ratio")


def test_whole_archive_ratio_bounds_many_small_members(tmp_path: Path) -> None:
    """Members under RATIO_MIN_BYTES escape the per-member zip check; the whole archive's ratio catches them
    before anything is written (zip and tar.gz alike)."""
    zeros = {f"z{i}.bin": bytes(1_000_000) for i in range(8)}  # 8 MB of zeros in ~8 KB
    bomb = _zip(tmp_path / "many.zip", zeros)
    assert bomb.stat().st_size * 100 < 8_000_000
    _assert_rejected(bomb, tmp_path / "o", r"member 'z\d\.bin' rejected: total declared size \d+ bytes exceeds 100 "
                                           r"times the archive's \d+ bytes \(limit max_ratio")
    tgz = _tar(tmp_path / "many.tgz", [(_info(name), data) for name, data in zeros.items()])
    _assert_rejected(tgz, tmp_path / "o", "max_ratio")
    # the same archive is fine under a ratio it keeps to; a small archive is never held to the ratio
    assert len(list(safe_extract(bomb, tmp_path / "ok", ExtractLimits(max_ratio=5000)).iterdir())) == 8
    small = _zip(tmp_path / "small.zip", {"a.bin": bytes(500_000)})
    assert (safe_extract(small, tmp_path / "small") / "a.bin").stat().st_size == 500_000

"""Bad uploads to POST /adapt get a clear 4xx and nothing is enqueued or left on disk."""

from __future__ import annotations

import io
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from stack_helpers import FAST_JOB, Stack, fast_job, png, target_zip

from t3ar.clients.api import ApiError


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(zipfile.ZipInfo(name), data) if name.startswith("/") else zf.writestr(name, data)
    return path


def _images(n: int = 3) -> dict[str, bytes]:
    rng = np.random.default_rng(5)
    return {f"img/{c}-{i}.png": png(c, rng) for i in range(n) for c in ("red", "green")}


def traversal(p: Path) -> Path:
    return _zip(p, {**_images(), "../../evil.png": png("red", np.random.default_rng(0))})


def absolute(p: Path) -> Path:
    return _zip(p, {**_images(), "/tmp/evil.png": png("red", np.random.default_rng(0))})


def symlink(p: Path) -> Path:
    p = p.with_suffix(".tar.gz")
    with tarfile.open(p, "w:gz") as tf:
        for name, data in _images().items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("img/passwd.png")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tf.addfile(link)
    return p


def bomb(p: Path) -> Path:
    with zipfile.ZipFile(p, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for name, data in _images().items():
            zf.writestr(name, data)
        with zf.open("img/huge.png", "w", force_zip64=True) as out:
            chunk = bytes(1 << 20)
            for _ in range(64):
                out.write(chunk)
    return p


def empty(p: Path) -> Path:
    return _zip(p, {})


def non_images(p: Path) -> Path:
    return _zip(p, {"notes/readme.txt": b"hello", "notes/data.csv": b"a,b\n1,2\n"})


def corrupt_image(p: Path) -> Path:
    good = _images()
    first = next(iter(good))
    return _zip(p, {**good, first: good[first][:60]})


def unknown_classes(p: Path) -> Path:
    return target_zip(p, classes=("red", "purple"))


def labels_outside(p: Path) -> Path:
    return _zip(p, {**_images(), "labels.csv": b"path,label\n../../api.sqlite3,red\n"})


def labels_missing_rows(p: Path) -> Path:
    imgs = _images()
    name = next(iter(imgs))
    return _zip(p, {**imgs, "labels.csv": f"path,label\n{name},red\n".encode()})


def not_an_archive(p: Path) -> Path:
    p.write_bytes(png("red", np.random.default_rng(0)))
    return p


CASES: list[tuple[Callable[[Path], Path], str]] = [
    (traversal, "path traversal"), (absolute, "absolute path"), (symlink, "symbolic link"),
    (bomb, "zip bomb"), (empty, "no readable images"), (non_images, "not an image"),
    (corrupt_image, "not a readable image"), (unknown_classes, "not known to the model"),
    (labels_outside, "relative to the archive root"), (labels_missing_rows, "has no row"),
    (not_an_archive, "not a zip or tar"),
]


def _nothing_enqueued(stack: Stack, before: tuple[int, int, set[str]]) -> None:
    with stack.api() as api:
        total = api.jobs(limit=1).total
    assert (total, stack.redis().llen("rq:queue:t3ar-adapt")) == before[:2]
    assert {p.name for p in (stack.data_dir / "api" / "jobs").iterdir()} == before[2]


def _snapshot(stack: Stack) -> tuple[int, int, set[str]]:
    with stack.api() as api:
        total = api.jobs(limit=1).total
    return total, stack.redis().llen("rq:queue:t3ar-adapt"), \
        {p.name for p in (stack.data_dir / "api" / "jobs").iterdir()}


@pytest.mark.parametrize(("make", "message"), CASES, ids=[c[0].__name__ for c in CASES])
def test_bad_archive_is_4xx_and_nothing_enqueued(stack: Stack, model_id: str, pool_ids: list[str], tmp_path: Path,
                                                 make: Callable[[Path], Path], message: str) -> None:
    archive = make(tmp_path / "target.zip")
    before = _snapshot(stack)
    with stack.api() as api, pytest.raises(ApiError) as err:
        api.adapt(archive, model_id, FAST_JOB)
    assert 400 <= err.value.status < 500, err.value
    assert message in str(err.value)
    _nothing_enqueued(stack, before)


@pytest.mark.parametrize(("config", "status", "message"), [
    ({"k": -1}, 422, "k"), ({"epochs": 1, "bogus": 1}, 422, "bogus"), ({"method": "magic"}, 422, "method"),
    ({**FAST_JOB, "k": 64}, 422, "the pool has"), ({"mode": "train", "method": "tent"}, 422, "needs labels"),
    ({**FAST_JOB, "fraction": 0.01}, 422, "at least 2"),
])
def test_bad_options_are_4xx(stack: Stack, model_id: str, pool_ids: list[str], tmp_path: Path,
                             config: dict[str, object], status: int, message: str) -> None:
    archive = target_zip(tmp_path / "t.zip", labels=False)
    before = _snapshot(stack)
    with stack.api() as api, pytest.raises(ApiError) as err:
        api.adapt(archive, model_id, config)
    assert err.value.status == status and message in str(err.value), err.value
    _nothing_enqueued(stack, before)


def test_unknown_model_is_404(stack: Stack, tmp_path: Path) -> None:
    before = _snapshot(stack)
    with stack.api() as api, pytest.raises(ApiError) as err:
        api.adapt(target_zip(tmp_path / "t.zip"), "no-such-model", FAST_JOB)
    assert err.value.status == 404
    _nothing_enqueued(stack, before)


def test_skip_bad_images_drops_them(stack: Stack, model_id: str, pool_ids: list[str], tmp_path: Path) -> None:
    archive = _zip(tmp_path / "t.zip", {**_images(), "img/readme.txt": b"not an image"})
    with stack.api() as api:
        accepted = api.adapt(archive, model_id, fast_job("tent"), skip_bad_images=True)
        assert accepted.target.skipped == 1 and accepted.target.images == 6
        assert any("readme.txt" in w for w in accepted.warnings)
        assert api.wait(accepted.id, poll=0.2, timeout=180).status == "finished"

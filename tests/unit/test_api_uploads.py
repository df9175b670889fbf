"""Upload validation of the API (no server, no Redis): archives, labels.csv, modes, options, size limits."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pytest
from mode_bound_method import mode_bound_method
from PIL import Image

from t3ar.errors import DatasetError, ImageDecodeError, InvalidInputError, UnsafeArchiveError
from t3ar_services.api.errors import PayloadTooLargeError
from t3ar_services.api.settings import ApiSettings
from t3ar_services.api.uploads import parse_config, prepare_target, save_upload, validate_config

CLASSES = ["blue", "green", "red"]


def _png(seed: int = 0) -> bytes:
    arr = np.random.default_rng(seed).integers(0, 255, (20, 20, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _settings(tmp_path: Path, **kw: object) -> ApiSettings:
    return ApiSettings(data_dir=tmp_path / "data", auth_disabled=True, validate_threads=0, **kw)  # type: ignore[arg-type]


def _prepare(tmp_path: Path, members: dict[str, bytes], config: str = "{}", skip: bool = False,
             **settings: object) -> tuple[object, object]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    archive = _zip(tmp_path / "a.zip", members)
    return prepare_target(archive, tmp_path / "job", _settings(tmp_path, **settings), CLASSES, parse_config(config),
                          skip_bad_images=skip)


def test_unlabelled_is_test_mode(tmp_path: Path) -> None:
    prepared, cfg = _prepare(tmp_path, {f"wrap/{i}.png": _png(i) for i in range(4)})
    assert prepared.n_images == 4 and not prepared.labelled  # type: ignore[attr-defined]
    assert cfg.mode == "test"  # type: ignore[attr-defined]


def test_labels_csv_switches_to_train_unless_mode_given(tmp_path: Path) -> None:
    members = {"x/a.png": _png(1), "x/b.png": _png(2), "labels.csv": b"path,label\nx/a.png,red\nx/b.png,blue\n"}
    prepared, cfg = _prepare(tmp_path, members)
    assert prepared.labelled and cfg.mode == "train"  # type: ignore[attr-defined]
    _, cfg = _prepare(tmp_path / "2", members, '{"mode": "test"}')
    assert cfg.mode == "test"  # type: ignore[attr-defined]


def test_test_mode_labels_do_not_change_the_subsample(tmp_path: Path) -> None:
    """Issue 50: in test mode the labels only score the job, so the images adapted on are the ones drawn without
    them (before, labels.csv made it a per-class draw of other images)."""
    images = {f"x/{i:02d}.png": _png(i) for i in range(20)}
    labels = "path,label\n" + "".join(f"x/{i:02d}.png,{CLASSES[0] if i < 17 else CLASSES[1 + i % 2]}\n"
                                       for i in range(20))
    config = '{"mode": "test", "fraction": 0.5, "seed": 3}'
    bare, _ = _prepare(tmp_path / "bare", images, config)
    scored, cfg = _prepare(tmp_path / "scored", {**images, "labels.csv": labels.encode()}, config)
    assert scored.labelled and cfg.mode == "test"  # type: ignore[attr-defined]
    assert scored.subsample.rows == bare.subsample.rows  # type: ignore[attr-defined]
    assert len(bare.subsample.rows) == 10  # type: ignore[attr-defined]
    trained, cfg = _prepare(tmp_path / "trained", {**images, "labels.csv": labels.encode()},
                            config.replace('"test"', '"train"'))
    assert cfg.mode == "train"  # type: ignore[attr-defined]  # train mode keeps its per-class draw
    assert {i for i in trained.subsample.rows if i >= 17} != set()  # type: ignore[attr-defined]


@pytest.mark.parametrize(("members", "error", "match"), [
    ({"../evil.png": b"x", "a.png": b"y"}, UnsafeArchiveError, "traversal"),
    ({}, DatasetError, "no readable images"),
    ({"a.png": _png(), "b.txt": b"hi"}, ImageDecodeError, "not an image file type"),
    ({"a.png": _png(), "b.png": _png()[:40]}, ImageDecodeError, "not a readable image"),
    ({"a.png": _png()}, DatasetError, "at least 2"),
    ({"a.png": _png(1), "b.png": _png(2), "labels.csv": b"path,label\na.png,red\nb.png,purple\n"}, DatasetError,
     "not known to the model: purple"),
    ({"a.png": _png(1), "b.png": _png(2), "labels.csv": b"path,label\na.png,red\n"}, DatasetError, "no row"),
    ({"a.png": _png(1), "b.png": _png(2), "labels.csv": b"path,label\na.png,red\nb.png,red\n/etc/x.png,red\n"},
     DatasetError, "relative"),
    ({"a.png": _png(1), "b.png": _png(2), "labels.csv": b"file,class\na.png,red\n"}, DatasetError, "header"),
])
def test_bad_targets(tmp_path: Path, members: dict[str, bytes], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        _prepare(tmp_path, members)


def test_not_an_archive(tmp_path: Path) -> None:
    path = tmp_path / "x.png"
    path.write_bytes(_png())
    with pytest.raises(UnsafeArchiveError, match="not a zip or tar"):
        prepare_target(path, tmp_path / "job", _settings(tmp_path), CLASSES, parse_config("{}"), skip_bad_images=False)


def test_archive_limits(tmp_path: Path) -> None:
    with pytest.raises(UnsafeArchiveError, match="max_files"):
        _prepare(tmp_path, {f"{i}.png": _png(i) for i in range(5)}, max_archive_files=3)


def test_skip_bad_images_removes_them(tmp_path: Path) -> None:
    prepared, _ = _prepare(tmp_path, {"a.png": _png(1), "b.png": _png(2), "c.txt": b"no"}, skip=True)
    assert prepared.n_images == 2 and len(prepared.skipped) == 1  # type: ignore[attr-defined]
    assert not (prepared.target_dir / "c.txt").exists()  # type: ignore[attr-defined]


def test_train_mode_without_labels(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="needs labels"):
        _prepare(tmp_path, {"a.png": _png(1), "b.png": _png(2)}, '{"mode": "train"}')


@pytest.mark.parametrize(("raw", "match"), [
    ("not json", "not valid JSON"), ("[1]", "JSON object"), ('{"k": -1}', "k"), ('{"x": 1}', "x"),
    ('{"method": "t3ar", "k": 0}', "k must be >= 1"),
])
def test_config_errors(raw: str, match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        validate_config(parse_config(raw))


@pytest.mark.parametrize(("raw", "match"), [("not json", "not valid JSON"), ("[1]", "JSON object"),
                                            ('{"method": "nope"}', "nope"), ('{"method": 3}', "method")])
def test_what_parse_config_refuses_before_the_archive_is_read(raw: str, match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        parse_config(raw)


def test_the_config_is_validated_in_the_mode_the_archive_decides(tmp_path: Path) -> None:
    """A labelled archive makes a train-time job: an option refused at train time is refused (no model_copy that
    skips validation); an explicit test mode keeps it."""
    members = {"a.png": _png(1), "b.png": _png(2), "labels.csv": b"path,label\na.png,red\nb.png,blue\n"}
    with mode_bound_method() as name:  # no product option is refused at train time only: a test method's is
        options = f'"method": "{name}", "watch": true'
        with pytest.raises(InvalidInputError, match="watch is a test-time option"):
            _prepare(tmp_path, members, "{" + options + "}")
        assert not (tmp_path / "job" / "subsample.json").exists()  # refused before the images are read
        _, cfg = _prepare(tmp_path / "2", members, "{" + options + ', "mode": "test"}')
        assert cfg.mode == "test" and cfg.watch  # type: ignore[attr-defined]


def test_save_upload_limits(tmp_path: Path) -> None:
    with pytest.raises(PayloadTooLargeError, match="LIMIT"):
        save_upload(io.BytesIO(b"x" * 100), tmp_path / "u", 10, "the thing", "LIMIT")
    assert not (tmp_path / "u").exists()
    with pytest.raises(InvalidInputError, match="empty"):
        save_upload(io.BytesIO(b""), tmp_path / "v", 10, "the thing", "LIMIT")
    assert save_upload(io.BytesIO(b"abc"), tmp_path / "w", 10, "the thing", "LIMIT") == 3


def test_settings_require_tokens() -> None:
    with pytest.raises(ValueError, match="T3AR_API_TOKEN"):
        ApiSettings(token=None, admin_token=None, auth_disabled=False)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must differ"):
        ApiSettings(token="a", admin_token="a")  # type: ignore[arg-type]

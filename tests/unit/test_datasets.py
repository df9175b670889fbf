"""Reading labelled/unlabelled image sets, class mapping, subsampling and tensor loading."""

from __future__ import annotations

import logging
import shutil
import zipfile
from pathlib import Path

import pytest
import torch
from PIL import Image

from t3ar.data.datasets import (
    ImageSet,
    class_map_check,
    find_labels_csv,
    load_tensors,
    read_labelled,
    read_unlabelled,
    stratified_subsample,
)
from t3ar.errors import DatasetError, ImageDecodeError, InvalidInputError


def _img(path: Path, colour: tuple[int, int, int] = (200, 10, 10), size: tuple[int, int] = (12, 10)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)
    return path


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    _img(root / "dog" / "d1.png")
    _img(root / "dog" / "sub" / "d2.jpg", (0, 90, 0))
    _img(root / "cat" / "c1.png", (0, 0, 255))
    return root


def _zip_dir(src: Path, dest: Path, prefix: str = "") -> Path:
    with zipfile.ZipFile(dest, "w") as zf:
        for p in sorted(src.rglob("*")):
            if p.is_file():
                zf.write(p, prefix + p.relative_to(src).as_posix())
    return dest


def test_imagefolder_dir(folder: Path) -> None:
    ds = read_labelled(folder)
    assert ds.classes == ["cat", "dog"]
    assert ds.ids == ["cat/c1.png", "dog/d1.png", "dog/sub/d2.jpg"]
    assert ds.labels == [0, 1, 1] and ds.labelled and len(ds) == 3 and ds.skipped == []
    assert ds.root == folder


def test_nested_single_root_is_descended(folder: Path, tmp_path: Path) -> None:
    wrapper = tmp_path / "wrap"
    shutil.copytree(folder, wrapper / "inner" / "dataset")
    ds = read_labelled(wrapper)
    assert ds.classes == ["cat", "dog"] and ds.ids[0] == "cat/c1.png"
    single_class = tmp_path / "one"
    _img(single_class / "only" / "x.png")
    assert read_labelled(single_class).classes == ["only"]


def test_archive_source(folder: Path, tmp_path: Path) -> None:
    archive = _zip_dir(folder, tmp_path / "ds.zip", prefix="my-data/")
    ds = read_labelled(archive, work_dir=tmp_path / "work")
    assert ds.classes == ["cat", "dog"] and ds.ids == ["cat/c1.png", "dog/d1.png", "dog/sub/d2.jpg"]
    assert ds.root is not None and (tmp_path / "work") in ds.root.parents
    ds2 = read_labelled(archive)  # private temp dir, alive for the process
    assert all(p.is_file() for p in ds2.paths)


def test_csv_manifest_with_missing_rows(tmp_path: Path) -> None:
    _img(tmp_path / "imgs" / "a.png")
    _img(tmp_path / "imgs" / "b.png")
    absolute = _img(tmp_path / "elsewhere" / "c.png")
    manifest = tmp_path / "imgs" / "labels.csv"
    manifest.write_text(f"path,label\na.png,zebra\nb.png,ant\nmissing.png,ant\n{absolute},zebra\n")
    ds = read_labelled(manifest)
    assert ds.classes == ["ant", "zebra"] and ds.labels == [1, 0, 1]
    assert ds.ids[:2] == ["a.png", "b.png"]
    assert ds.skipped == [("missing.png", "row 4: file not found: missing.png")]
    with pytest.raises(DatasetError, match="row 4"):
        read_labelled(manifest, strict=True)
    bad = tmp_path / "bad.csv"
    bad.write_text("file,class\nx,y\n")
    with pytest.raises(DatasetError, match="path,label"):
        read_labelled(bad)


def test_corrupt_files_skipped_with_one_warning(folder: Path, caplog: pytest.LogCaptureFixture) -> None:
    (folder / "cat" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    (folder / "dog" / "notes.txt").write_text("not an image")
    with caplog.at_level(logging.WARNING, logger="t3ar.data.datasets"):
        ds = read_labelled(folder)
    assert len(ds) == 3 and sorted(i for i, _ in ds.skipped) == ["cat/broken.png", "dog/notes.txt"]
    assert len([r for r in caplog.records if "skipped 2" in r.getMessage()]) == 1
    with pytest.raises(ImageDecodeError, match="broken.png"):
        read_labelled(folder, strict=True)


def test_empty_dataset_explains_layout(tmp_path: Path) -> None:
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    with pytest.raises(DatasetError, match="expected an ImageFolder"):
        read_labelled(tmp_path / "empty")
    with pytest.raises(DatasetError, match="does not exist"):
        read_unlabelled(tmp_path / "nope")


def test_unlabelled_dir_and_labels_csv_not_applied(tmp_path: Path) -> None:
    root = tmp_path / "u"
    _img(root / "x" / "1.png")
    _img(root / "2.webp")
    (root / "labels.csv").write_text("path,label\n2.webp,a\n")
    ds = read_unlabelled(root, num_workers=2)
    assert ds.ids == ["2.webp", "x/1.png"] and ds.labels is None and ds.classes is None and ds.skipped == []
    assert find_labels_csv(ds.root or root) == root / "labels.csv"
    assert find_labels_csv(root / "x") is None
    archive = _zip_dir(root, tmp_path / "u.zip", prefix="wrapper/")
    from_zip = read_unlabelled(archive, work_dir=tmp_path / "w")
    assert from_zip.ids == ds.ids and from_zip.root is not None and find_labels_csv(from_zip.root) is not None


def test_subset(folder: Path) -> None:
    ds = read_labelled(folder)
    sub = ds.subset([2, 0])
    assert isinstance(sub, ImageSet) and sub.ids == ["dog/sub/d2.jpg", "cat/c1.png"] and sub.labels == [1, 0]
    assert sub.classes == ds.classes and len(ds) == 3


def test_class_map_check() -> None:
    assert class_map_check(["cat", "dog"], ["dog", "bird", "cat"]) == [2, 0]
    with pytest.raises(DatasetError, match="unicorn, yeti"):
        class_map_check(["cat", "unicorn", "yeti"], ["cat", "dog"])


def test_stratified_subsample() -> None:
    labels = [0] * 100 + [1] * 3 + [2] * 10
    a = stratified_subsample(labels, len(labels), 0.1, seed=1)
    assert a == stratified_subsample(labels, len(labels), 0.1, seed=1) == sorted(a)
    picked = [labels[i] for i in a]
    assert picked.count(0) == 10 and picked.count(1) == 1 and picked.count(2) == 1
    assert stratified_subsample(labels, len(labels), 0.1, seed=2) != a
    assert stratified_subsample(labels, len(labels), 1.0, seed=0) == list(range(len(labels)))
    assert len(stratified_subsample(None, 50, 0.01, seed=3)) == 1
    assert stratified_subsample(None, 50, 0.2, seed=3) == stratified_subsample(None, 50, 0.2, seed=3)
    for bad in (0.0, 1.5):
        with pytest.raises(InvalidInputError):
            stratified_subsample(None, 5, bad, seed=0)


def test_load_tensors(folder: Path) -> None:
    ds = read_labelled(folder)
    x = load_tensors(ds, 8)
    assert x.shape == (3, 3, 8, 8) and x.dtype == torch.uint8
    assert x[0, :, 4, 4].tolist() == [0, 0, 255]
    assert torch.equal(x, load_tensors(ds, 8, num_workers=2, progress=True))

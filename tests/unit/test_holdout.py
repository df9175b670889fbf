"""A job's holdout: its layouts, each refusal of check_holdout, and the acceptance options (candidates and their
configs)."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from t3ar.acceptance import DEFAULT_RULE
from t3ar.acceptance_options import AcceptanceOptions, candidate_config, candidate_names, parse_options
from t3ar.data.datasets import read_unlabelled
from t3ar.data.holdout import HoldoutError, check_holdout, image_digests, read_holdout
from t3ar.errors import InvalidInputError
from t3ar.method.config import adapt_config

CLASSES = ["cat", "dog", "owl"]


def _img(path: Path, colour: tuple[int, int, int]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (12, 10), colour).save(path)
    return path


@pytest.fixture()
def folders(tmp_path: Path) -> Path:
    root = tmp_path / "holdout"
    _img(root / "cat" / "a.png", (200, 0, 0))
    _img(root / "dog" / "b.png", (0, 200, 0))
    _img(root / "dog" / "c.png", (0, 0, 200))
    return root


@pytest.fixture()
def target(tmp_path: Path) -> Path:
    root = tmp_path / "target"
    _img(root / "t1.png", (10, 10, 10))
    _img(root / "t2.png", (20, 20, 20))
    return root


def _digests(root: Path) -> list[str]:
    return image_digests(read_unlabelled(root, strict=True))


def test_class_folders(folders: Path, target: Path) -> None:
    h = read_holdout(folders)
    assert len(h) == 3 and h.named == ("cat", "dog") and h.images.classes == ["cat", "dog"]
    check_holdout(h, CLASSES, target_digests=_digests(target))  # passes


def test_csv_and_labels_csv(tmp_path: Path, target: Path) -> None:
    d = tmp_path / "flat"
    _img(d / "x.png", (1, 2, 3))
    _img(d / "y.png", (4, 5, 6))
    (d / "list.csv").write_text("path,label\nx.png,cat\ny.png,owl\n")
    h = read_holdout(d / "list.csv")
    assert sorted(h.named) == ["cat", "owl"] and len(h) == 2
    (d / "labels.csv").write_text("path,label\nx.png,cat\ny.png,owl\n")
    (d / "list.csv").unlink()
    h2 = read_holdout(d)  # what an uploaded archive holds
    assert sorted(h2.named) == ["cat", "owl"]
    check_holdout(h2, CLASSES, target_digests=_digests(target))


def test_unknown_label_is_refused(folders: Path, target: Path) -> None:
    _img(folders / "zebra" / "z.png", (9, 9, 9))
    with pytest.raises(HoldoutError, match="zebra"):
        check_holdout(read_holdout(folders), CLASSES, target_digests=_digests(target))


def test_a_named_class_without_image_is_refused(folders: Path, target: Path) -> None:
    (folders / "owl").mkdir()
    h = read_holdout(folders)
    assert "owl" in h.named
    with pytest.raises(HoldoutError, match="owl have no image"):
        check_holdout(h, CLASSES, target_digests=_digests(target))


def test_overlap_with_the_target_is_refused(folders: Path, target: Path) -> None:
    (folders / "cat" / "copy.png").write_bytes((target / "t2.png").read_bytes())  # the same bytes, another name
    with pytest.raises(HoldoutError, match=r"1 image\(s\) are also in the target .*cat/copy.png"):
        check_holdout(read_holdout(folders), CLASSES, target_digests=_digests(target))


def test_too_large_is_refused(folders: Path, target: Path) -> None:
    with pytest.raises(HoldoutError, match="3 images, more than the 2 allowed \\(T3AR_API_MAX_HOLDOUT_IMAGES\\)"):
        check_holdout(read_holdout(folders), CLASSES, target_digests=_digests(target), max_images=2,
                      setting="T3AR_API_MAX_HOLDOUT_IMAGES")


def test_unlabelled_or_unreadable_is_refused(tmp_path: Path) -> None:
    flat = tmp_path / "flat"
    _img(flat / "a.png", (1, 1, 1))
    with pytest.raises(HoldoutError):
        read_holdout(flat)  # images outside any class folder
    bad = tmp_path / "bad"
    _img(bad / "cat" / "a.png", (1, 1, 1))
    (bad / "cat" / "b.png").write_bytes(b"not an image")
    with pytest.raises(InvalidInputError):
        read_holdout(bad)


def test_options_and_candidates() -> None:
    cfg = adapt_config(method="tent", epochs=3, lr=0.01, seed=7)
    opts = parse_options("", False, None)
    assert opts == AcceptanceOptions() and opts.rule == DEFAULT_RULE
    assert candidate_names(opts, cfg) == ["source", "bn-adapt", "tent"]
    assert candidate_names(parse_options("t3ar, tent,bn-adapt", True, "argmax"), cfg) == ["bn-adapt", "t3ar", "tent"]
    with pytest.raises(InvalidInputError, match="unknown candidate"):
        parse_options("t3ar,magic", False, None)
    with pytest.raises(InvalidInputError, match="rule"):
        parse_options(None, False, "best")
    assert candidate_config(cfg, "tent") is cfg
    bn = candidate_config(cfg, "bn-adapt")
    assert (bn.method, bn.seed, bn.mode) == ("bn-adapt", 7, "test")  # its config has no schedule: none passed
    assert set(bn.model_dump()) == {"method", "mode", "fraction", "seed", "batch_size", "train_groups"}
    assert set(candidate_config(cfg, "source").model_dump()) == {"method", "mode", "fraction", "seed"}
    t3 = candidate_config(adapt_config(method="t3ar-noretrieval", mode="train", seed=2), "t3ar")
    assert t3.method == "t3ar" and t3.mode == "train" and t3.preset == "validated" and t3.seed == 2


def test_images_already_in_the_pool_are_refused(folders: Path) -> None:
    from t3ar.data.holdout import refuse_pooled

    h = read_holdout(folders).images
    digests = dict(zip(h.ids, image_digests(h), strict=True))
    refuse_pooled(digests, {"0" * 64: "p/1"})  # passes
    with pytest.raises(HoldoutError, match=r"1 image\(s\) are already in the pool .*dog/b.png \(pool item p/7\)"):
        refuse_pooled(digests, {digests["dog/b.png"]: "p/7"})

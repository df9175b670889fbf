"""The benchmark's labelled pool: family exclusion per shift, archive components, and the per-style use report."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from t3ar.datakit.archive import DEFAULT_ARCHIVE, family_of
from t3ar_bench.method.data import Kits, pool_components, side_table
from t3ar_bench.method.labelled_pool import (
    ARCHIVE_POOL_STYLES,
    excluded_families,
    labelled_use,
    pool_names,
    pool_style_shares,
    style_of,
)
from t3ar_bench.method.plans import EMOJI_SOURCES, EVAL_SHIFTS, VALIDATION_SHIFT

CLIPART = ("openclipart", "tuxpaint")


@pytest.mark.parametrize("shift", [VALIDATION_SHIFT, *EVAL_SHIFTS])
def test_a_targets_family_and_the_sources_never_enter_its_pool(shift: str) -> None:
    names = pool_names(shift, CLIPART, EMOJI_SOURCES, DEFAULT_ARCHIVE)
    assert names[:2] == list(CLIPART)
    labelled = names[2:]
    assert shift not in labelled
    assert all(family_of(s) not in {family_of(shift), family_of("google")} for s in labelled)
    # the benchmark's archive list leaves at least 6 archive styles of other artwork in every pool
    assert len(pool_names(shift, (), (), ARCHIVE_POOL_STYLES)) >= 6


def test_pool_names_by_shift() -> None:
    assert excluded_families("openmoji") == {"openmoji", "noto"}
    assert excluded_families("twitter", exclude_source_family=False) == {"twemoji"}
    om = pool_names("openmoji", CLIPART, EMOJI_SOURCES, ("twemoji", "noto", "fxemoji", "openmoji-iconify"))
    assert om == [*CLIPART, "twitter", "fluent3d", "twemoji", "fxemoji"]  # openmoji-black is the same artwork
    tw = pool_names("twitter", (), EMOJI_SOURCES, ("noto", "twemoji", "fluent-emoji"), exclude_source_family=False)
    assert tw == ["openmoji", "openmoji-black", "fluent3d", "noto", "fluent-emoji"]
    fl = pool_names("fluent3d", (), EMOJI_SOURCES, ARCHIVE_POOL_STYLES)
    assert not {"fluent-emoji", "fluent-emoji-high-contrast", "noto"} & set(fl)


def test_labelled_use_per_style() -> None:
    used = [("noto-v1/1f600", "face-smiling", "face-smiling"),
            ("noto-v1/1f600", "face-smiling", "face-affection"),  # the same item for another query
            ("noto-v1/2764", "heart", "heart"),
            ("fxemoji/1f436", "animal-mammal", "animal-bird"),
            ("openclipart/ab12", None, "heart"),  # an unlabelled neighbour: not a labelled use
            ("twitter/1f431", "", "heart")]
    rep = labelled_use(used)
    assert (rep.uses, rep.items, rep.query_class, rep.skipped) == (4, 3, 2, 2)
    assert rep.query_class_share == pytest.approx(0.5)
    nv, fx = rep.styles["noto-v1"], rep.styles["fxemoji"]
    assert (nv.uses, nv.items, nv.query_class) == (3, 2, 2)
    assert nv.share == pytest.approx(0.75) and nv.query_class_share == pytest.approx(2 / 3)
    assert (fx.uses, fx.query_class, fx.share) == (1, 0, pytest.approx(0.25))
    assert list(rep.styles) == ["fxemoji", "noto-v1"]
    assert rep.to_dict()["styles"]["fxemoji"]["uses"] == 1


def test_labelled_use_against_a_batchs_classes() -> None:
    """A random draw has no query of its own: a use counts when its label is one of the batch's classes."""
    rep = labelled_use([("emojione/1", "heart", frozenset({"heart", "face-smiling"})),
                        ("emojione/2", "time", ("heart",)), ("emojione/3", "heart", "heart")])
    assert (rep.uses, rep.query_class) == (3, 2)


def test_labelled_use_of_nothing_is_empty() -> None:
    rep = labelled_use([("openclipart/x", None, "heart")])
    assert (rep.uses, rep.query_class_share, rep.styles, rep.skipped) == (0, 0.0, {}, 1)


def test_pool_style_shares_count_labelled_items_only() -> None:
    labels = {"noto-v1/a": "x", "noto-v1/b": "y", "fxemoji/c": "x"}
    ids = ["noto-v1/a", "noto-v1/b", "fxemoji/c", "openclipart/z"]
    assert pool_style_shares(ids, labels) == pytest.approx({"fxemoji": 1 / 3, "noto-v1": 2 / 3})
    assert pool_style_shares(["openclipart/z"], labels) == {}
    assert style_of("fluent-emoji-high-contrast/1f600") == "fluent-emoji-high-contrast"


def _png(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), (200, 10, 10)).save(path)


def test_pool_components_include_archive_styles_with_their_labels(tmp_path: Path) -> None:
    for rel in ("emoji/twitter/heart/2764-fe0f.png", "emoji/twitter/face-smiling/1f600.png",
                "pool/openclipart/aa.png", "pool/tuxpaint/bb.png",
                "archive/fxemoji/heart/2764-fe0f.png", "archive/noto-v1/face-smiling/1f601.png",
                "archive/noto-v1/heart/1f49b.png"):
        _png(tmp_path / rel)
    kits = Kits(tmp_path / "emoji", tmp_path / "pool", {}, 0.0, tmp_path / "archive")
    comps = pool_components(kits, ["twitter"], None, archive_styles=["fxemoji", "noto-v1"])
    assert list(comps) == ["openclipart", "tuxpaint", "twitter", "fxemoji", "noto-v1"]
    assert comps["openclipart"].labels is None
    side = side_table(list(comps.values()))
    assert side["noto-v1/1f49b"] == ("heart", "1f49b") and side["fxemoji/2764-fe0f"] == ("heart", "2764-fe0f")
    assert "openclipart/aa" not in side
    capped = pool_components(kits, [], 1, archive_styles=["noto-v1"])
    assert len(capped["noto-v1"].ids) == 1 and capped["noto-v1"].labels is not None
    with pytest.raises(ValueError, match="without the archive"):
        pool_components(Kits(tmp_path / "emoji", tmp_path / "pool", {}, 0.0), [], None, archive_styles=["fxemoji"])

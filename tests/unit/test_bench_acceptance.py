"""The acceptance round of `t3ar bench adapt`: archive styles as targets, the acceptance holdout, the goals over
shifts x seeds, label-free selection measured leave-one-shift-out; with fake data and fake runs (no training)."""

import dataclasses
from pathlib import Path

import pytest
from PIL import Image

from t3ar.bench.method.data import Kits
from t3ar.bench.method.plans import QUICK
from t3ar.bench.method.protocol import holdout_indices
from t3ar.bench.method.runs import archive_needed, load_targets


def _png(path: Path, colour: tuple[int, int, int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), colour).save(path)


def test_an_archive_style_is_a_target_with_the_tasks_classes(tmp_path: Path) -> None:
    classes = ["animal-bird", "face-smiling", "food-fruit"]
    for c in classes:  # the source style has every class
        for n in range(3):
            _png(tmp_path / "emoji" / "google" / c / f"1f60{n}-{c}.png", (200, 10 * n, 0))
    # the archive style lacks a class (animal-bird): its labels still index the source's class list
    for c, n in (("face-smiling", 0), ("face-smiling", 1), ("food-fruit", 0), ("food-fruit", 1), ("food-fruit", 2)):
        _png(tmp_path / "archive" / "emojione" / c / f"1f34{n}-{c}.png", (0, 10 * n, 200))
    kits = Kits(tmp_path / "emoji", tmp_path / "pool", {}, 0.0, tmp_path / "archive")
    plan = dataclasses.replace(QUICK, eval_shifts=("emojione",), validation_shift="emojione", image_size=8,
                               eval_share=0.5, max_adapt=None, max_eval=None)
    source, targets = load_targets(plan, kits)
    tgt = targets["emojione"]
    assert tgt.style.classes == source.classes == classes
    names = tgt.style.label_names(range(len(tgt.style.items)))
    assert names.count("face-smiling") == 2 and names.count("food-fruit") == 3 and "animal-bird" not in names
    assert sorted(tgt.adapt_idx + tgt.eval_idx) == list(range(5))
    # a folder whose class is not the task's is refused, and an archive target needs the archive
    _png(tmp_path / "archive" / "emojione" / "flag-country" / "1f1e6.png", (1, 2, 3))
    with pytest.raises(RuntimeError, match="not the task's"):
        load_targets(plan, kits)
    with pytest.raises(RuntimeError, match="without the archive"):
        load_targets(plan, dataclasses.replace(kits, archive=None))


def test_the_kits_hold_the_archive_shifts() -> None:
    plan = dataclasses.replace(QUICK, eval_shifts=("twitter", "emojione"), archive_styles=("noto-v1",),
                               extra_validation_shifts=("fluent-emoji-high-contrast",))
    assert archive_needed(plan) == ("noto-v1", "fluent-emoji-high-contrast", "emojione")
    assert archive_needed(QUICK) == ()


def test_the_holdout_is_outside_the_adapted_subset_per_class_and_nested() -> None:
    labels = [0] * 6 + [1] * 3 + [2] * 1  # images 0-9
    adapt = list(range(10))
    subset = [0, 1, 6]
    h1 = holdout_indices(adapt, subset, labels, 1, seed=0)
    h2 = holdout_indices(adapt, subset, labels, 2, seed=0)
    h4 = holdout_indices(adapt, subset, labels, 4, seed=0)
    for h in (h1, h2, h4):
        assert not set(h) & set(subset) and set(h) <= set(adapt)
    assert [labels[i] for i in h1] == [0, 1, 2]  # one per class
    assert sorted(labels[i] for i in h2) == [0, 0, 1, 1, 2]  # class 2 has one image left
    assert sorted(labels[i] for i in h4) == [0, 0, 0, 0, 1, 1, 2]  # class 0 has 4 left, class 1 two
    assert set(h1) <= set(h2) <= set(h4)
    assert holdout_indices(adapt, subset, labels, 2, seed=0) == h2  # deterministic in the seed
    assert holdout_indices(list(range(5)), list(range(5)), labels, 1, seed=0) == []  # nothing left
    with pytest.raises(ValueError):
        holdout_indices(adapt, subset, labels, 0, seed=0)




def test_target_measures_score_the_holdout_and_the_target_without_labels() -> None:
    import torch

    from t3ar.bench.method.data import StyleSet
    from t3ar.bench.method.runs import Target, target_measures
    from t3ar.method.augment import Normalizer
    from t3ar.models.backbones import BackboneSpec
    from t3ar.models.classifier import ModelSpec, build_classifier

    torch.manual_seed(0)
    spec = ModelSpec(backbone=BackboneSpec(name="mobilenetv2_050", weights="none"), classes=("a", "b"), image_size=32)
    model = build_classifier(spec)
    labels = torch.tensor([0, 0, 0, 1, 1, 1, 0, 1])
    style = StyleSet("x", torch.randint(0, 255, (8, 3, 32, 32), dtype=torch.uint8), labels, ["a", "b"],
                     [str(i) for i in range(8)])
    tgt = Target("x", style, adapt_idx=[0, 1, 2, 3, 4, 5], eval_idx=[6, 7])
    norm = Normalizer(spec.backbone.mean, spec.backbone.std, torch.device("cpu"))
    got = target_measures(model, tgt, [0, 3], seed=0, holdout_per_class=(1, 2), norm=norm)
    assert set(got["criteria"]) == {"entropy", "im", "snd", "snd_features"}
    assert len(got["target_predictions"]) == 2
    assert got["holdout"]["1"]["n"] == 2 and got["holdout"]["2"]["n"] == 4  # from images 1, 2, 4, 5 only
    with torch.no_grad():
        model.eval()
        pred = model(norm(style.images[[1, 2, 4, 5]])).argmax(1)
    assert got["holdout"]["2"]["top1"] == pytest.approx(float((pred == labels[[1, 2, 4, 5]]).float().mean()))

"""The `t3ar` CLI end to end on small generated data (fast): commands, JSON output, clear errors."""

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from t3ar.cli.main import cli
from t3ar.models.backbones import BackboneSpec
from t3ar.models.checkpoint import load_checkpoint, save_checkpoint
from t3ar.models.classifier import ModelSpec, build_classifier

CLASSES = ("circle", "square")


def _draw(path: Path, shape: str, hue: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    img = Image.new("RGB", (40, 40), (255, 255, 255))
    from PIL import ImageDraw

    d = ImageDraw.Draw(img)
    o = int(torch.randint(2, 10, (1,), generator=g))
    box = (o, o, 30 + o // 2, 30 + o // 2)
    colour = (hue, 255 - hue, 120)
    (d.ellipse if shape == "circle" else d.rectangle)(box, fill=colour)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cli")
    for style, hue in (("source", 30), ("target", 200)):
        for c in CLASSES:
            for i in range(8):
                _draw(root / style / c / f"{c}{i}.png", c, hue, i)
    for i in range(12):
        _draw(root / "pool" / f"p{i}.png", CLASSES[i % 2], 120, 100 + i)
    (root / "pool" / "notes.txt").write_text("not an image")  # skipped with a warning
    spec = ModelSpec(backbone=BackboneSpec(name="mobilenetv2_050", weights="none"), classes=CLASSES, image_size=32)
    save_checkpoint(root / "base.pt", build_classifier(spec), spec)
    return {"root": root, "base": root / "base.pt", "source": root / "source", "target": root / "target",
            "pool": root / "pool"}


def _invoke(*args: str) -> dict[str, object]:
    res = CliRunner().invoke(cli, [*args, "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_adapt_every_method_and_evaluate(data: dict[str, Path]) -> None:
    for method in ("source", "tent", "shot-im", "adacontrast", "t3ar-noretrieval", "t3ar-random", "t3ar", "sar",
                   "eata"):
        out = data["root"] / f"{method}.pt"
        retrieval = ["--k", "2", "--r", "2"] if method in ("t3ar", "t3ar-random") else []  # another's: refused
        schedule = ["--epochs", "1", "--batch-size", "8"] if method != "source" else []  # source has none
        got = _invoke("adapt", "--model", str(data["base"]), "--target", str(data["target"]), "--pool",
                      str(data["pool"]), "--method", method, *retrieval, *schedule, "--retriever-image-size", "32",
                      "--out", str(out))
        assert got["method"] == method and "before" in got and "after" in got
        _, info = load_checkpoint(out)
        assert info.lineage.method == method and info.adapt_config is not None
        assert info.adapt_config["method"] == method
        assert info.lineage.base_model_sha256 and info.lineage.target_size == 16
        if method in ("t3ar", "t3ar-random"):
            assert info.lineage.pool_ids and all(p.startswith("p") for p in info.lineage.pool_ids)
            assert info.lineage.retriever and info.lineage.retriever.startswith("timm:tf_efficientnet_lite0")
        else:
            assert info.lineage.pool_ids == ()
        ev = _invoke("evaluate", "--model", str(out), "--data", str(data["target"]))
        assert ev["n"] == 16 and set(ev["per_class"]) == set(CLASSES)  # type: ignore[arg-type]


def test_method_options_through_config(data: dict[str, Path]) -> None:
    out = data["root"] / "opts.pt"
    _invoke("adapt", "--model", str(data["base"]), "--target", str(data["target"]), "--pool", str(data["pool"]),
            "--method", "t3ar", "--k", "2", "--r", "2", "--epochs", "1", "--batch-size", "8",
            "--retriever-image-size", "32", "--config", '{"dedup_threshold": 0.95, "false_negatives": "mask"}',
            "--out", str(out))
    _, info = load_checkpoint(out)
    assert info.adapt_config is not None
    retrieval = info.adapt_config["retrieval"]  # the nested, canonical form
    assert retrieval["dedup_threshold"] == 0.95 and retrieval["false_negatives"] == "mask"


def test_fraction_and_train_time_mode(data: dict[str, Path]) -> None:
    got = _invoke("adapt", "--model", str(data["base"]), "--target", str(data["target"]), "--method",
                  "t3ar-noretrieval", "--labels", "--fraction", "0.25", "--epochs", "1", "--out",
                  str(data["root"] / "tt.pt"))
    assert got["adapted_on"] == 4  # 25% of 8 per class, stratified
    _, info = load_checkpoint(data["root"] / "tt.pt")
    assert info.adapt_config and info.adapt_config["mode"] == "train"


def test_train_source_writes_a_loadable_checkpoint(data: dict[str, Path]) -> None:
    weights = data["root"] / "w.pth"
    torch.save(build_classifier(ModelSpec(backbone=BackboneSpec(name="mobilenetv2_050", weights="none"),
                                          classes=CLASSES)).backbone.state_dict(), weights)
    got = _invoke("train-source", "--data", str(data["source"]), "--arch", "timm:mobilenetv2_050", "--weights",
                  str(weights), "--image-size", "32", "--epochs", "1", "--val-fraction", "0.25",
                  "--out", str(data["root"] / "src.pt"))
    assert got["classes"] == 2 and got["val_size"] == 4 and got["train_size"] == 12
    model, info = load_checkpoint(data["root"] / "src.pt")
    assert info.spec.classes == CLASSES and info.lineage.method == "source"


@pytest.mark.parametrize(("args", "message"), [
    (["adapt", "--method", "t3ar"], "--pool"),
    (["adapt", "--method", "adacontrast", "--fraction", "0"], "fraction"),
    (["adapt", "--method", "adacontrast", "--labels", "--k", "-1"], "k"),
    (["adapt", "--method", "adacontrast", "--device", "cuda:7"], "cuda"),
    (["adapt", "--method", "adacontrast", "--train-groups", "most"], "invalid"),
    (["adapt", "--method", "adacontrast", "--labels"], "test-time method"),
    (["adapt", "--method", "t3ar", "--config", '{"false_negatives": "some"}'], "false_negatives"),
    (["adapt", "--method", "t3ar", "--config", '{"pool_negatives": "all"}'], "no benchmark round kept it"),
    (["adapt", "--method", "t3ar", "--config", '{"redraw_neighbours": true}'], "no benchmark round kept it"),
    (["adapt", "--method", "t3ar", "--config", "[1]"], "JSON object"),
    (["adapt", "--method", "source", "--lr", "0.01"], "lr is an option of"),
])
def test_bad_options_give_clear_errors(data: dict[str, Path], args: list[str], message: str) -> None:
    res = CliRunner().invoke(cli, [args[0], "--model", str(data["base"]), "--target", str(data["target"]),
                                   "--out", str(data["root"] / "x.pt"), *args[1:]])
    assert res.exit_code != 0 and message in res.output and "Traceback" not in res.output
    assert not (data["root"] / "x.pt").exists()


def test_wrong_classes_and_bad_checkpoint(data: dict[str, Path], tmp_path: Path) -> None:
    other = tmp_path / "other"
    _draw(other / "triangle" / "t.png", "square", 10, 0)
    _draw(other / "circle" / "c.png", "circle", 10, 0)
    res = CliRunner().invoke(cli, ["evaluate", "--model", str(data["base"]), "--data", str(other)])
    assert res.exit_code == 1 and "triangle" in res.output
    (tmp_path / "fake.pt").write_bytes(b"\x00" * 100)
    res = CliRunner().invoke(cli, ["evaluate", "--model", str(tmp_path / "fake.pt"), "--data", str(other)])
    assert res.exit_code == 1 and "not a t3ar checkpoint" in res.output


def test_adapt_with_a_labelled_local_pool_names_the_neighbours_that_served_as_data(data: dict[str, Path]) -> None:
    """Issue 33: ``--pool-labels folders`` labels POOL/<class>/ images; a folder that is not one of the model's
    classes and loose images are unlabelled, so only model-class images serve as labelled data, with their
    folder's label, and the output says which."""
    pool = data["root"] / "labelled-pool"
    for i in range(12):
        _draw(pool / CLASSES[i % 2] / f"l{i}.png", CLASSES[i % 2], 160, 200 + i)
        _draw(pool / "triangle" / f"t{i}.png", CLASSES[i % 2], 160, 300 + i)  # not a model class
        _draw(pool / f"loose{i}.png", CLASSES[i % 2], 160, 400 + i)
    got = _invoke("adapt", "--model", str(data["base"]), "--target", str(data["target"]), "--pool", str(pool),
                  "--pool-labels", "folders", "--method", "t3ar", "--k", "4", "--epochs", "1", "--batch-size", "8",
                  "--retriever-image-size", "32", "--config", '{"pool_label_weight": 1.0}',
                  "--out", str(data["root"] / "labelled.pt"))
    served = got["labelled_neighbours"]
    assert isinstance(served, list) and served
    for use in served:
        assert use["label"] in CLASSES and use["pool_id"].startswith(use["label"] + "/") and use["uses"] >= 1
    text = CliRunner().invoke(cli, ["adapt", "--model", str(data["base"]), "--target", str(data["target"]),
                                    "--pool", str(pool), "--pool-labels", "folders", "--method", "t3ar", "--k", "4",
                                    "--epochs", "1", "--batch-size", "8", "--retriever-image-size", "32",
                                    "--config", '{"pool_label_weight": 1.0}', "--out",
                                    str(data["root"] / "labelled2.pt")], catch_exceptions=False)
    assert text.exit_code == 0 and "served as labelled data (" in text.output, text.output
    without = _invoke("adapt", "--model", str(data["base"]), "--target", str(data["target"]), "--pool", str(pool),
                      "--method", "t3ar", "--k", "4", "--epochs", "1", "--batch-size", "8",
                      "--retriever-image-size", "32", "--config", '{"pool_label_weight": 1.0}',
                      "--out", str(data["root"] / "unlabelled.pt"))
    assert without["labelled_neighbours"] == []  # no --pool-labels: the pool carries no label

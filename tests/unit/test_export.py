"""`t3ar export` (issue 35): a checkpoint with a real pretrained backbone (the packaged EfficientNet-Lite0 ImageNet
weights, at 32 px) exported to ONNX and safetensors, checked against the checkpoint on real photos (scikit-image's
bundled ones, cropped); a failed parity check leaves nothing; the loader takes the safetensors file back."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from t3ar.cli.main import cli
from t3ar.data.datasets import load_tensors, read_labelled
from t3ar.errors import CheckpointError, InvalidInputError
from t3ar.export import TOLERANCE, export_checkpoint
from t3ar.export.probe import generated_images, images_for_parity
from t3ar.method.augment import Normalizer
from t3ar.models.backbones import PRESETS
from t3ar.models.checkpoint import Lineage, load_checkpoint, read_info, save_checkpoint
from t3ar.models.classifier import ModelSpec, build_classifier

pytest.importorskip("onnxruntime", reason="the export extra: bash scripts/setup.sh")
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

CLASSES = ("astronaut", "cat", "coffee", "rocket", "other")
SIZE = 32
LINEAGE = Lineage(base_model_sha256="b" * 64, target_sha256="t" * 64, target_size=80, pool_ids=("p-1", "p-2"),
                  retriever="efficientnet_lite0@32", method="t3ar")


def _photos(root: Path) -> Path:
    """80 real photo crops as PNGs in an ImageFolder (a class per source photo: the labelled set `evaluate` takes)."""
    from skimage import data

    sources = {"astronaut": data.astronaut(), "cat": data.chelsea(), "coffee": data.coffee(),
               "rocket": data.rocket(), "other": data.immunohistochemistry()}
    extra = [data.hubble_deep_field(), data.colorwheel(), data.retina()]
    n = 0
    for cls, img in [*sources.items(), *(("other", e) for e in extra)]:
        h, w = img.shape[:2]
        for i in range(10):  # overlapping windows across the photo
            y, x = (h // 3) * (i % 3) // 2, (w // 4) * (i // 3) // 2
            crop = img[y:y + h // 2 + 1, x:x + w // 2 + 1, :3]
            (root / cls).mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.ascontiguousarray(crop)).save(root / cls / f"{n:03d}.png")
            n += 1
    return root


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("export")


@pytest.fixture(scope="module")
def photos(work: Path) -> Path:
    return _photos(work / "photos")


@pytest.fixture(scope="module")
def checkpoint(work: Path) -> Path:
    """Lite0 with its packaged ImageNet weights, a seeded bottleneck and weight-normalised head, BatchNorm running
    statistics moved off their defaults (as training leaves them), and a lineage."""
    torch.manual_seed(0)
    spec = ModelSpec(backbone=PRESETS["efficientnet_lite0"], classes=CLASSES, image_size=SIZE)
    model = build_classifier(spec)
    bn = model.bottleneck[1]
    bn.running_mean.normal_(0, 0.1)
    bn.running_var.uniform_(0.5, 2.0)
    path = work / "adapted.pt"
    save_checkpoint(path, model, spec, adapt_config={"method": "t3ar", "k": 3}, lineage=LINEAGE,
                    metrics={"after": {"top1": 0.5}})
    return path


@pytest.fixture(scope="module")
def onnx_export(work: Path, checkpoint: Path, photos: Path) -> Iterator[tuple[Path, Any]]:
    out = work / "adapted.onnx"
    result = CliRunner().invoke(cli, ["export", str(checkpoint), "--format", "onnx", "--out", str(out),
                                      "--images", str(photos)])
    yield out, result


def _reference(checkpoint: Path, images: torch.Tensor) -> np.ndarray:
    model, info = load_checkpoint(checkpoint)
    norm = Normalizer(info.spec.backbone.mean, info.spec.backbone.std, torch.device("cpu"))
    with torch.no_grad():
        out: np.ndarray = model.eval()(norm(images)).numpy()
    return out


@pytest.mark.slow  # a real pretrained backbone, exported and run twice: ~15 s on 2 idle cores
def test_onnx_export_prints_its_parity_and_matches_torch_on_real_photos(onnx_export: tuple[Path, Any],
                                                                        checkpoint: Path, photos: Path) -> None:
    out, result = onnx_export
    assert result.exit_code == 0, result.output
    figures = re.search(r"max abs logit diff (\S+) .*top-1 agreement (\d+)/(\d+)", result.output)
    assert figures and "64 images of photos" in result.output, result.output
    assert float(figures.group(1)) <= TOLERANCE and figures.group(2) == figures.group(3) == "64"
    # checked again here, independently of the command: onnxruntime against the checkpoint as t3ar loads it
    images, _ = images_for_parity(SIZE, photos)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    (inp,), (outp,) = session.get_inputs(), session.get_outputs()
    assert (inp.name, inp.type, inp.shape[1:]) == ("images", "tensor(uint8)", [SIZE, SIZE, 3])
    assert outp.name == "logits" and outp.shape[1] == len(CLASSES) and isinstance(inp.shape[0], str)  # dynamic
    nhwc = images.permute(0, 2, 3, 1).numpy()
    got = np.concatenate([session.run(None, {"images": nhwc[:3]})[0], session.run(None, {"images": nhwc[3:]})[0]])
    want = _reference(checkpoint, images)
    assert np.abs(got - want).max() <= TOLERANCE
    assert (got.argmax(1) == want.argmax(1)).all()
    assert len(set(want.argmax(1).tolist())) > 1  # the photos do not all land in one class: top-1 is a real check


@pytest.mark.slow  # a real pretrained backbone, exported and run twice: ~15 s on 2 idle cores
def test_onnx_metadata_names_classes_normalisation_size_and_lineage(onnx_export: tuple[Path, Any],
                                                                    checkpoint: Path) -> None:
    out, _ = onnx_export
    meta = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    info = read_info(checkpoint)
    assert json.loads(meta["t3ar.classes"]) == list(CLASSES)
    assert int(meta["t3ar.image_size"]) == SIZE
    assert json.loads(meta["t3ar.mean"]) == list(info.spec.backbone.mean)
    assert json.loads(meta["t3ar.std"]) == list(info.spec.backbone.std)
    assert meta["t3ar.base_model_sha256"] == LINEAGE.base_model_sha256
    assert meta["t3ar.target_sha256"] == LINEAGE.target_sha256
    assert meta["t3ar.checkpoint_sha256"] == info.sha256
    assert Lineage.model_validate_json(meta["t3ar.lineage"]) == LINEAGE
    assert ModelSpec.model_validate_json(meta["t3ar.spec"]) == info.spec
    assert re.fullmatch(r"[0-9a-f]{64}", meta["t3ar.lineage_sha256"])
    assert "uint8" in meta["t3ar.input"] and "[batch, 32, 32, 3]" in meta["t3ar.input"]
    # what inference runs: the head a plain Gemm (no weight-norm arithmetic on g and v), the backbone's
    # BatchNorms folded into its convolutions; the bottleneck's BatchNorm1d stays, in inference mode
    nodes = onnx.load(str(out)).graph.node
    ops = [n.op_type for n in nodes]
    assert ops.count("BatchNormalization") == 1 and "ReduceL2" not in ops and "Cast" in ops
    bn = next(n for n in nodes if n.op_type == "BatchNormalization")
    assert all(a.i == 0 for a in bn.attribute if a.name == "training_mode")


@pytest.mark.slow  # a real pretrained backbone, exported and run twice: ~15 s on 2 idle cores
def test_safetensors_loads_back_to_the_identical_model(work: Path, checkpoint: Path, photos: Path) -> None:
    out = work / "adapted.safetensors"
    report = export_checkpoint(checkpoint, "safetensors", out)
    assert report.parity.max_abs_diff == 0.0 and report.parity.top1_agreement == 1.0
    assert report.parity.images_source == "64 generated images (seed 0)"
    a, info_a = load_checkpoint(checkpoint)
    b, info_b = load_checkpoint(out)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    assert all(sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]) for k in sa)
    assert (info_b.spec, info_b.lineage, info_b.adapt_config, info_b.metrics) == \
        (info_a.spec, info_a.lineage, info_a.adapt_config, info_a.metrics)
    assert info_b.sha256 == report.sha256 != info_a.sha256
    from safetensors import safe_open

    with safe_open(str(out), "pt") as fh:  # the header metadata, readable without t3ar
        meta = fh.metadata()
    assert ModelSpec.model_validate_json(meta["spec"]) == info_a.spec and meta["source_sha256"] == info_a.sha256
    # a t3ar command that takes a checkpoint takes it: the same evaluation as from the .pt
    runner = CliRunner()
    scores = [json.loads(runner.invoke(cli, ["evaluate", "--model", str(m), "--data", str(photos), "--json",
                                             "--device", "cpu"]).output) for m in (checkpoint, out)]
    assert scores[0]["top1"] == scores[1]["top1"] and scores[0]["n"] == 80


@pytest.mark.slow  # a real pretrained backbone, exported and run twice: ~15 s on 2 idle cores
def test_a_failed_parity_check_exits_non_zero_and_leaves_nothing(work: Path, checkpoint: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from t3ar.export import exporter

    real = exporter.onnx_logits
    monkeypatch.setattr(exporter, "onnx_logits", lambda data, images: real(data, images) + 0.01)
    out = work / "broken.onnx"
    result = CliRunner().invoke(cli, ["export", str(checkpoint), "--format", "onnx", "--out", str(out)])
    assert result.exit_code == 1 and not out.exists()
    assert "does not reproduce" in result.output and "max |logit diff| 1.00e-02" in result.output
    assert sorted(p.name for p in work.iterdir() if p.name.startswith(".")) == []  # no temp file either


def test_files_that_are_not_t3ar_checkpoints_and_unknown_formats_are_refused(work: Path, checkpoint: Path) -> None:
    from safetensors.torch import save_file

    plain = work / "plain.safetensors"
    save_file({"w": torch.zeros(2)}, str(plain))
    with pytest.raises(CheckpointError, match="without t3ar metadata"):
        load_checkpoint(plain)
    with pytest.raises(CheckpointError, match="without t3ar metadata"):
        export_checkpoint(plain, "onnx", work / "x.onnx")
    with pytest.raises(InvalidInputError, match="unknown export format 'tflite'"):
        export_checkpoint(checkpoint, "tflite", work / "x.tflite")
    assert not (work / "x.onnx").exists() and not (work / "x.tflite").exists()


def _doc_example() -> str:
    """The python block of the section "Serving an adapted model", wherever the docs keep it."""
    root = Path(__file__).resolve().parents[2]
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        text = doc.read_text()
        if "# Serving an adapted model" in text:
            found = re.search(r"```python\n(.*?)```", text.split("# Serving an adapted model", 1)[1], re.S)
            assert found, f"{doc}: no python block under 'Serving an adapted model'"
            return found.group(1)
    raise AssertionError("no section 'Serving an adapted model' in README.md or docs/")


@pytest.mark.slow  # shares the exported model of the tests above
def test_the_serving_example_in_the_docs_runs_and_agrees_with_t3ar(onnx_export: tuple[Path, Any],
                                                                   checkpoint: Path, work: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    from skimage import data

    from t3ar.data.images import open_image, to_tensor_uint8

    code = _doc_example()
    assert len(code.strip().splitlines()) <= 16
    run = work / "serving"
    run.mkdir()
    shutil.copy(onnx_export[0], run / "adapted.onnx")
    Image.fromarray(data.chelsea()).save(run / "photo.jpg", quality=90)
    monkeypatch.chdir(run)
    exec(compile(code, "docs: Serving an adapted model", "exec"), {"__name__": "__doc_example__"})
    printed = capsys.readouterr().out.strip()
    want = _reference(checkpoint, to_tensor_uint8(open_image(run / "photo.jpg"), SIZE)[None])
    assert printed == CLASSES[int(want[0].argmax())]
    # a transparent image: the example feeds the model exactly what t3ar does (transparency composited on white;
    # a plain convert("RGB") keeps the colours hidden under it, and agreed with the checkpoint on 33 of 60)
    rgba = np.dstack([data.chelsea(), np.where(np.arange(data.chelsea().shape[1]) < 200, 0, 255)[None, :]
                      .repeat(data.chelsea().shape[0], 0).astype(np.uint8)])
    Image.fromarray(rgba, "RGBA").save(run / "photo.png")
    found: dict[str, Any] = {"__name__": "__doc_example__"}
    exec(compile(code.replace("photo.jpg", "photo.png"), "docs: Serving an adapted model", "exec"), found)
    t3ar_input = to_tensor_uint8(open_image(run / "photo.png"), SIZE).permute(1, 2, 0).numpy()
    assert np.array_equal(np.asarray(found["img"]), t3ar_input)


def test_generated_parity_images_are_deterministic_pictures() -> None:
    a, b = generated_images(8, 32), generated_images(8, 32)
    assert torch.equal(a, b) and a.dtype == torch.uint8 and a.shape == (8, 3, 32, 32)
    assert len({bytes(x.numpy()) for x in a}) == 8 and float(a.float().std()) > 30  # distinct, not flat


def test_a_target_with_fewer_than_64_images_is_topped_up(photos: Path) -> None:
    few = read_labelled(photos).subset(range(5))
    images, source = images_for_parity(SIZE, few.paths)
    assert images.shape == (64, 3, SIZE, SIZE) and source == "5 images of the given images + 59 generated (seed 0)"
    assert torch.equal(images[:5], load_tensors(few, SIZE))


def test_safetensors_export_keeps_nan_and_tuple_metrics(tmp_path: Path) -> None:
    """A NaN metric (a report from before issue 29) and tuples in the metrics survive; the check at export does
    not call them a difference."""
    from t3ar.models.backbones import BackboneSpec

    spec = ModelSpec(backbone=BackboneSpec(name="mobilenetv2_050", weights="none"), classes=("a", "b"),
                     image_size=SIZE)
    save_checkpoint(tmp_path / "m.pt", build_classifier(spec), spec,
                    metrics={"after": {"top1": float("nan")}, "shape": (3, 4)})
    report = export_checkpoint(tmp_path / "m.pt", "safetensors", tmp_path / "m.safetensors",
                               images=generated_images(4, SIZE), images_source="4 generated")
    assert report.parity.ok and report.parity.images == 4
    _, info = load_checkpoint(tmp_path / "m.safetensors")
    assert np.isnan(info.metrics["after"]["top1"]) and info.metrics["shape"] == [3, 4]


def test_the_parity_check_runs_in_chunks_and_gives_the_one_batch_result(onnx_export: tuple[Path, Any],
                                                                          checkpoint: Path, photos: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The check's memory is one chunk's activations whatever the image count (the API ran 64 images at the
    model's size in one batch), and chunking changes none of its figures."""
    from t3ar.export import parity

    out, _ = onnx_export
    model, info = load_checkpoint(checkpoint)
    images, source = images_for_parity(SIZE, photos)
    seen: list[int] = []
    model.register_forward_pre_hook(lambda _m, args: seen.append(len(args[0])))
    chunked = parity.reference_logits(model, info.spec, images)
    assert len(seen) > 1 and max(seen) <= parity.CHUNK and sum(seen) == len(images) == 64
    fed: list[int] = []
    real_session = ort.InferenceSession

    class Watched(real_session):  # type: ignore[misc, valid-type]
        def run(self, names: Any, feeds: dict[str, np.ndarray], *a: Any) -> Any:
            fed.extend(len(v) for v in feeds.values())
            return super().run(names, feeds, *a)

    monkeypatch.setattr(ort, "InferenceSession", Watched)
    data = out.read_bytes()
    onnx_chunked = parity.onnx_logits(data, images)
    assert fed[0] == 1 and max(fed) <= parity.CHUNK and sum(fed) == 64
    monkeypatch.setattr(parity, "CHUNK", 64)
    whole = parity.reference_logits(model, info.spec, images)
    onnx_whole = parity.onnx_logits(data, images)
    np.testing.assert_allclose(chunked, whole, atol=1e-5)
    a, b = parity.compare(chunked, onnx_chunked, source), parity.compare(whole, onnx_whole, source)
    assert a.ok and b.ok and a.top1_agreement == b.top1_agreement == 1.0
    assert abs(a.max_abs_diff - b.max_abs_diff) < 1e-5


def test_the_export_memory_estimate_grows_with_the_image_size() -> None:
    """What the API compares with its export cap: weights, parity images and one chunk's activations."""
    from t3ar.export.parity import CHUNK
    from t3ar.export.size import export_memory_bytes, model_footprint

    small = ModelSpec(backbone=PRESETS["efficientnet_lite0"], classes=CLASSES, image_size=SIZE)
    big = small.model_copy(update={"image_size": 1024})
    weights, largest = model_footprint(big)
    assert 10e6 < weights < 30e6  # Lite0: ~4.7 M parameters (float32) with the head
    assert largest >= 32 * 512 * 512 * 4  # at least the stem's output: 32 channels at half the size
    need = export_memory_bytes(big, 64)
    assert need > 2 * CHUNK * largest + 2 * 64 * 3 * 1024**2
    assert need > 20 * export_memory_bytes(small, 64) > 0  # at 32 px the weights are most of it


def test_the_export_estimate_measures_a_model_whose_builder_cannot_run_on_meta() -> None:
    """open_clip's builder copies tensors between devices (it fails on torch's meta device): the estimate builds it
    on the CPU and measures the forward pass on meta."""
    pytest.importorskip("open_clip")
    from t3ar.export.size import model_footprint
    from t3ar.models.backbones import BackboneSpec

    spec = ModelSpec(backbone=BackboneSpec(kind="open_clip", name="ViT-B-32", weights="none"), classes=CLASSES,
                     image_size=224)
    weights, largest = model_footprint(spec)
    assert 300e6 < weights < 400e6  # ViT-B/32: ~88 M parameters
    assert largest >= 50 * 768 * 4  # at least one token sequence (49 patches + class token) of width 768

"""Backbones, classifier, checkpoints and the embedder."""

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from t3ar.device import resolve_device
from t3ar.embedder import Embedder, EmbedderSpec
from t3ar.errors import (
    CheckpointError,
    DeviceUnavailableError,
    DivergedError,
    InvalidInputError,
    WeightsUnavailableError,
)
from t3ar.models.backbones import PRESETS, BackboneSpec, build_backbone, parse_backbone
from t3ar.models.checkpoint import Lineage, load_checkpoint, read_info, save_checkpoint
from t3ar.models.classifier import ModelSpec, build_classifier, configure_trainable

CLASSES = ("a", "b", "c")


def _random_spec(name: str = "mobilenetv2_050", classes: tuple[str, ...] = CLASSES) -> ModelSpec:
    return ModelSpec(backbone=BackboneSpec(name=name, weights="none"), classes=classes, image_size=32)


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    spec = _random_spec()
    model = build_classifier(spec).eval()
    x = torch.randn(2, 3, 32, 32)
    lineage = Lineage(base_model_sha256="abc", pool_ids=("p1", "p2"), retriever="r", method="t3ar")
    sha = save_checkpoint(tmp_path / "m.pt", model, spec, adapt_config={"k": 5}, lineage=lineage,
                          metrics={"top1": 0.5})
    loaded, info = load_checkpoint(tmp_path / "m.pt")
    assert info.sha256 == sha and info.spec == spec and info.lineage == lineage
    assert info.adapt_config == {"k": 5} and info.metrics == {"top1": 0.5}
    assert torch.allclose(loaded.eval()(x), model(x), atol=1e-6)
    assert not list(tmp_path.glob(".*tmp"))  # atomic write leaves no temp file


def test_checkpoint_mismatch_errors(tmp_path: Path) -> None:
    spec = _random_spec()
    save_checkpoint(tmp_path / "m.pt", build_classifier(spec), spec)
    with pytest.raises(CheckpointError, match="class list differs"):
        load_checkpoint(tmp_path / "m.pt", expect=_random_spec(classes=("a", "b", "z")))
    with pytest.raises(CheckpointError, match="architecture"):
        load_checkpoint(tmp_path / "m.pt", expect=_random_spec(classes=("a", "b")))
    with pytest.raises(CheckpointError, match="architecture"):
        load_checkpoint(tmp_path / "m.pt", expect=_random_spec(name="mobilenetv2_100"))


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_a_diverged_model_is_not_written(tmp_path: Path, bad: float) -> None:
    """What a diverged adaptation left (an infinite BatchNorm variance, as a job with the acceptance round's options
    produced on a small model) is refused before anything is written, and an earlier file stays as it was."""
    spec = _random_spec()
    model = build_classifier(spec)
    save_checkpoint(tmp_path / "m.pt", model, spec)
    before = (tmp_path / "m.pt").read_bytes()
    bn = next(m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))
    bn.running_var[0] = bad
    with pytest.raises(DivergedError, match=r"non-finite values in 1 of its tensors \(.*running_var\)"):
        save_checkpoint(tmp_path / "m.pt", model, spec)
    assert (tmp_path / "m.pt").read_bytes() == before and not list(tmp_path.glob(".*tmp"))


def test_checkpoint_rejects_foreign_and_corrupt_files(tmp_path: Path) -> None:
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not a t3ar checkpoint"):
        read_info(tmp_path / "junk.pt")
    torch.save({"weights": torch.zeros(1)}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="no 't3ar.checkpoint' header"):
        read_info(tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not found"):
        read_info(tmp_path / "missing.pt")


def test_checkpoint_with_tampered_weights_is_refused(tmp_path: Path) -> None:
    spec = _random_spec()
    save_checkpoint(tmp_path / "m.pt", build_classifier(spec), spec)
    payload = torch.load(tmp_path / "m.pt", weights_only=True)
    payload["state_dict"].pop(next(iter(payload["state_dict"])))
    torch.save(payload, tmp_path / "bad.pt")
    with pytest.raises(CheckpointError, match="do not fit"):
        load_checkpoint(tmp_path / "bad.pt")


@pytest.mark.parametrize("preset", ["efficientnet_lite0", "efficientnet_lite1", "efficientnet_lite2"])
def test_packaged_efficientnet_classifies_a_real_cat_photo(preset: str) -> None:
    """The packaged ImageNet weights are real: scikit-image's bundled photo of Chelsea the cat."""
    from skimage import data

    from t3ar.data.images import to_tensor_uint8
    from t3ar.models.backbones import packaged_weights_file

    spec = PRESETS[preset]
    net = build_backbone(spec).eval()
    fc = torch.load(packaged_weights_file(spec), weights_only=True)
    w, b = fc["_fc.weight"], fc["_fc.bias"]  # the package's own 1000-way ImageNet classifier
    img = to_tensor_uint8(Image.fromarray(data.chelsea()), 224).float().div(255)
    x = (img - torch.tensor(spec.mean).view(3, 1, 1)) / torch.tensor(spec.std).view(3, 1, 1)
    with torch.no_grad():
        top5 = (net(x[None]) @ w.T + b).topk(5).indices[0].tolist()
    cats = {281, 282, 283, 284, 285, 287}  # tabby, tiger cat, Persian, Siamese, Egyptian cat, lynx
    assert top5[0] in cats and len(cats & set(top5)) >= 3


def test_lite2_embedder_gives_unit_norm_1280d_vectors_with_its_own_identity() -> None:
    emb = Embedder(EmbedderSpec(backbone=PRESETS["efficientnet_lite2"], image_size=96))
    vecs = emb.embed(torch.randint(0, 256, (3, 3, 96, 96), dtype=torch.uint8))
    assert emb.dim == 1280 and vecs.shape == (3, 1280) and vecs.dtype == np.float32
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert emb.identity.startswith("timm:tf_efficientnet_lite2:") and emb.identity.endswith(":96px")
    assert emb.identity != Embedder(EmbedderSpec(image_size=96)).identity  # the Lite0 default
    assert EmbedderSpec.parse("efficientnet_lite1").backbone == PRESETS["efficientnet_lite1"]


def test_missing_weight_sources_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(WeightsUnavailableError, match="not found"):
        build_backbone(BackboneSpec(name="resnet18", weights="file", path=str(tmp_path / "none.pth")))
    with pytest.raises(InvalidInputError, match="needs --weights"):
        parse_backbone("timm:resnet18")
    with pytest.raises(InvalidInputError, match="unknown backbone"):
        parse_backbone("vgg-by-wishful-thinking")
    with pytest.raises(InvalidInputError, match="needs --pretrained"):
        parse_backbone("clip:ViT-B-32")


def test_open_clip_by_tag_without_cache_fails_clearly(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import huggingface_hub.constants as hf

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    # huggingface_hub reads the variables when it is first imported: once an earlier test imported it, only the
    # constants count (without this the hub was tried with retries: 47 s in the full suite, 3 s alone)
    monkeypatch.setattr(hf, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hf, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(WeightsUnavailableError, match="local file"):
        build_backbone(parse_backbone("clip:RN50", pretrained_tag="openai"))


def test_open_clip_from_local_checkpoint(tmp_path: Path) -> None:
    """The production path for CLIP weights: a local open_clip checkpoint file (here a random-init one)."""
    import open_clip

    model = open_clip.create_model("RN50", pretrained=None)
    torch.save(model.state_dict(), tmp_path / "rn50.pt")
    emb = Embedder(EmbedderSpec.parse("clip:RN50", weights_path=str(tmp_path / "rn50.pt"), image_size=224))
    vecs = emb.embed(torch.randint(0, 255, (2, 3, 224, 224), dtype=torch.uint8))
    assert vecs.shape == (2, 1024)
    assert emb.identity.startswith("open_clip:RN50:")


def test_timm_local_weights_file(tmp_path: Path) -> None:
    ref = build_backbone(BackboneSpec(name="mobilenetv2_050", weights="none"))
    torch.save(ref.state_dict(), tmp_path / "w.pth")
    spec = parse_backbone("timm:mobilenetv2_050", weights_path=str(tmp_path / "w.pth"))
    net = build_backbone(spec)
    for (k, a), b in zip(ref.state_dict().items(), net.state_dict().values(), strict=True):
        assert torch.equal(a, b), k


def test_configure_trainable_last_groups() -> None:
    model = build_classifier(_random_spec())
    params = configure_trainable(model, 1)
    frozen = [p for p in model.backbone.parameters() if not p.requires_grad]
    assert frozen and params
    assert all(p.requires_grad for p in model.head.parameters())
    configure_trainable(model, 1, head=False)
    assert not any(p.requires_grad for p in model.head.parameters())
    assert len(configure_trainable(model, None)) == len(list(model.parameters()))


def test_embedder_unit_norm_deterministic_identity() -> None:
    emb = Embedder(EmbedderSpec(image_size=64))
    imgs = [Image.new("RGB", (80, 60), (255, 0, 0)), Image.new("RGB", (64, 64), (0, 0, 255))]
    a, b = emb.embed(imgs), emb.embed(imgs)
    assert a.dtype == np.float32 and a.shape == (2, 1280)
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    assert np.array_equal(a, b)
    assert emb.identity == Embedder(EmbedderSpec(image_size=64)).identity
    assert emb.identity != Embedder(EmbedderSpec(image_size=96)).identity


def test_resolve_device() -> None:
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type in {"cpu", "cuda"}
    if not torch.cuda.is_available():
        with pytest.raises(DeviceUnavailableError, match="CUDA is not available"):
            resolve_device("cuda")
    with pytest.raises(DeviceUnavailableError):
        resolve_device("tpu")

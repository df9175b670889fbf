"""Labels and class names refuse invisible and bidi formatting characters (Unicode category Cf, line and
paragraph separators) wherever they enter: pool labels (the library's rule, the retriever), a target's labels
(folder names, labels.csv) and a model's class names. ``do<U+200B>g`` shows as ``dog`` and never matches it."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from console_kit import console_client, new_pool, png_image
from fastapi.testclient import TestClient
from retriever_kit import ADMIN, vector_retriever

from t3ar.data.datasets import read_labelled
from t3ar.data.pool_labels import check_label, hidden_character
from t3ar.errors import DatasetError, InvalidInputError
from t3ar.models.backbones import BackboneSpec
from t3ar.models.checkpoint import save_checkpoint
from t3ar.models.classifier import ModelSpec, build_classifier

USER = {"Authorization": "Bearer user-t"}
HIDDEN = {"\u202e": "U+202E (RIGHT-TO-LEFT OVERRIDE)", "\u200b": "U+200B (ZERO WIDTH SPACE)",
          "\u2028": "U+2028 (LINE SEPARATOR)", "\ufeff": "U+FEFF (ZERO WIDTH NO-BREAK SPACE)",
          "\u2029": "U+2029 (PARAGRAPH SEPARATOR)", "\u00ad": "U+00AD (SOFT HYPHEN)",
          # N8 (issue 50): invisible characters outside the format category (letters, marks, a symbol)
          "\u3164": "U+3164 (HANGUL FILLER)", "\u115f": "U+115F (HANGUL CHOSEONG FILLER)",
          "\ufe0f": "U+FE0F (VARIATION SELECTOR-16)", "\u034f": "U+034F (COMBINING GRAPHEME JOINER)",
          "\u2800": "U+2800 (BRAILLE PATTERN BLANK)"}


@pytest.mark.parametrize("ch", sorted(HIDDEN))
def test_the_label_rule_refuses_hidden_characters_and_names_them(ch: str) -> None:
    assert hidden_character(f"do{ch}g") == HIDDEN[ch]
    with pytest.raises(InvalidInputError) as err:
        check_label(f"do{ch}g")
    assert HIDDEN[ch] in str(err.value)


def test_visible_non_ascii_labels_stay_allowed() -> None:
    for label in ("café", "日本犬", "Straße", "a b", "العربية"):
        assert hidden_character(label) is None and check_label(label) == label


def test_the_retriever_refuses_a_hidden_character_in_a_label(tmp_path: Path) -> None:
    vec = np.ones((1, 4), dtype="<f4").tobytes()
    with vector_retriever(tmp_path / "pool", 4) as client:
        for ch in HIDDEN:
            resp = client.post("/pool/vectors", headers=ADMIN, content=vec,
                               params={"identity": "synthetic", "label": f"do{ch}g"})
            assert resp.status_code == 422 and HIDDEN[ch] in resp.json()["error"]["message"], resp.text
        assert client.get("/pool", headers=ADMIN).json()["total"] == 0
        assert client.post("/pool/vectors", headers=ADMIN, content=vec,
                           params={"identity": "synthetic", "label": "dog"}).status_code == 200


def test_a_target_label_with_a_hidden_character_is_refused_by_name(tmp_path: Path) -> None:
    for i, cls in enumerate(("dog", "do\u200bg")):
        (tmp_path / "set" / cls).mkdir(parents=True)
        (tmp_path / "set" / cls / f"{i}.png").write_bytes(png_image(i))
    with pytest.raises(DatasetError, match=r"U\+200B"):
        read_labelled(tmp_path / "set")
    csv_root = tmp_path / "csv"
    csv_root.mkdir()
    for i in range(2):
        (csv_root / f"{i}.png").write_bytes(png_image(i))
    (csv_root / "labels.csv").write_text("path,label\n0.png,cat\n1.png,c\u202eat\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"U\+202E"):
        read_labelled(csv_root / "labels.csv")


@pytest.fixture()
def client(tmp_path: Path) -> TestClient:
    yield from console_client(tmp_path, new_pool())


def _model(tmp_path: Path, classes: tuple[str, ...]) -> bytes:
    spec = ModelSpec(backbone=BackboneSpec(name="mobilenetv2_050", weights="none"), classes=classes, image_size=32)
    save_checkpoint(tmp_path / "m.pt", build_classifier(spec), spec)
    return (tmp_path / "m.pt").read_bytes()


def test_the_api_refuses_hidden_characters_in_class_names_and_target_labels(client: TestClient,
                                                                            tmp_path: Path) -> None:
    bad = client.post("/models", files={"file": ("m.pt", _model(tmp_path, ("dog", "do\u200bg")))},
                      data={"name": "m"}, headers=USER)
    assert bad.status_code == 422 and "U+200B (ZERO WIDTH SPACE)" in bad.json()["error"]["message"], bad.text
    assert client.get("/models", headers=USER).json()["models"] == []
    ok = client.post("/models", files={"file": ("m.pt", _model(tmp_path, ("dog", "cat")))}, data={"name": "m"},
                     headers=USER)
    assert ok.status_code in (200, 201), ok.text
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for i in range(4):
            zf.writestr(f"{i}.png", png_image(i))
        zf.writestr("labels.csv", "path,label\n0.png,dog\n1.png,cat\n2.png,do\u200bg\n3.png,dog\n")
    resp = client.post("/adapt", files={"archive": ("t.zip", buf.getvalue())}, headers=USER,
                       data={"model_id": ok.json()["id"], "config": json.dumps({"method": "tent", "epochs": 1})})
    assert resp.status_code == 422 and "U+200B (ZERO WIDTH SPACE)" in resp.json()["error"]["message"], resp.text


def test_a_pool_file_name_with_a_hidden_character_is_rejected_by_name(tmp_path: Path) -> None:
    """N8 (issue 50): U+202E in a pool image's file name (``gnp.exe`` shown as ``exe.png``) passed; now the item
    is rejected naming the character, and the others of the request go on."""
    from t3ar_services.retriever.pool import AddOutcome
    from t3ar_services.retriever.settings import RetrieverSettings
    from t3ar_services.retriever.uploads import expand_uploads

    settings = RetrieverSettings(data_dir=tmp_path / "pool", auth_disabled=True)  # type: ignore[call-arg]
    (tmp_path / "pool" / "tmp").mkdir(parents=True)
    png = png_image(1)
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("in\u3164side.png", png)
        zf.writestr("fine.png", png)
    archive.seek(0)
    items = expand_uploads([("cat\u202egnp.png", io.BytesIO(png)), ("ok.png", io.BytesIO(png)),
                            ("a.zip", archive)], settings)
    outcomes = [it for it in items if isinstance(it, AddOutcome)]
    assert [(o.status, o.error["code"] if o.error else "") for o in outcomes] == [("rejected", "bad_name")] * 2
    assert "U+202E (RIGHT-TO-LEFT OVERRIDE)" in str(outcomes[0].error) and "U+3164" in str(outcomes[1].error)
    assert [it[0] for it in items if isinstance(it, tuple)] == ["ok.png", "a.zip/fine.png"]

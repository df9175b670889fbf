"""A method defined in one file (toy_method.py) and registered once runs through the CLI's `t3ar adapt`, and the
API's POST /adapt validates and sizes a job of it, without any other module naming it."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from error_envelope import expect_error
from PIL import Image
from test_api_routes import _adapt, _archive, _model
from test_api_worker_routes import env  # noqa: F401 - the fixture

from t3ar.cli.main import cli
from t3ar.method import registry
from t3ar.models.backbones import BackboneSpec
from t3ar.models.checkpoint import load_checkpoint, save_checkpoint
from t3ar.models.classifier import ModelSpec, build_classifier

NAME = "toy-self-training"


@pytest.fixture
def toy() -> Iterator[str]:
    """The toy method registered (by importing its module) for one test, and gone after it."""
    assert NAME not in registry.names()
    importlib.import_module("toy_method")
    try:
        yield NAME
    finally:
        registry.unregister(NAME)
        sys.modules.pop("toy_method", None)


def test_the_toy_is_unknown_until_its_module_registers_it(toy: str) -> None:
    spec = registry.get(toy)
    assert spec.optimises and spec.train_mode and not spec.family and spec.retrieval is None
    step = spec.step_class()
    assert step is not None and step.__module__ == "toy_method"


def test_the_cli_adapts_with_the_toy(toy: str, tmp_path: Path) -> None:
    for c, colour in (("a", (200, 30, 30)), ("b", (30, 30, 200))):
        for i in range(4):
            (tmp_path / "target" / c).mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (32, 32), (colour[0], colour[1] + 10 * i, colour[2])).save(tmp_path / "target" / c
                                                                                      / f"{i}.png")
    spec = ModelSpec(backbone=BackboneSpec(name="mobilenetv2_050", weights="none"), classes=("a", "b"), image_size=32)
    save_checkpoint(tmp_path / "base.pt", build_classifier(spec), spec)
    help_text = CliRunner().invoke(cli, ["adapt", "--help"]).output
    assert toy in help_text
    res = CliRunner().invoke(cli, ["adapt", "--model", str(tmp_path / "base.pt"), "--target", str(tmp_path / "target"),
                                   "--method", toy, "--epochs", "2", "--batch-size", "4", "--out",
                                   str(tmp_path / "toy.pt"), "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert got["method"] == toy and got["adapted_on"] == 8
    _, info = load_checkpoint(tmp_path / "toy.pt")
    assert info.lineage.method == toy and info.adapt_config is not None and info.adapt_config["method"] == toy
    assert info.adapt_config.get("preset") is None  # not of the T3AR family: no preset


def test_the_api_accepts_and_sizes_a_toy_job(toy: str, env: Any, tmp_path: Path) -> None:  # noqa: F811
    client, _, data = env
    model_id = _model(client, tmp_path)
    resp = _adapt(client, model_id, _archive(), {"method": toy, "epochs": 3, "batch_size": 2})
    assert resp.status_code == 202, resp.text
    assert resp.json()["config"]["method"] == toy
    doc = client.get("/openapi.json").json()  # the config's schema in the document is the registry's union
    config = doc["components"]["schemas"]["AdaptConfig"]
    assert config["discriminator"]["mapping"][toy] == "#/components/schemas/ToySelfTrainingConfig"
    form = doc["paths"]["/adapt"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]["$ref"]
    field = doc["components"]["schemas"][form.rsplit("/", 1)[1]]["properties"]["config"]
    assert field["contentSchema"] == {"$ref": "#/components/schemas/AdaptConfig"}
    state = client.app.state.api
    state.settings = state.settings.model_copy(update={"max_job_steps": 5})  # 4 images / 2 a batch * 3 = 6 steps
    resp = _adapt(client, model_id, _archive(), {"method": toy, "epochs": 3, "batch_size": 2})
    assert "6 optimiser steps" in expect_error(resp, 422, "invalid_input", "T3AR_API_MAX_JOB_STEPS")["message"]


def test_an_unregistered_method_is_refused_by_the_api(env: Any, tmp_path: Path) -> None:  # noqa: F811
    client, _, data = env
    resp = _adapt(client, _model(client, tmp_path), _archive(), {"method": NAME})
    expect_error(resp, 422, "invalid_input", "unknown method")

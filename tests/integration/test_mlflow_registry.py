"""The MLflow registry calls (t3ar_services.api.modelreg.mlflow_ops) against a real MLflow tracking server: a
registered version's ONNX model loads with ``mlflow.pyfunc`` and agrees with the checkpoint on top-1; 20 attempts
interrupted at every step, then retried, leave one run and one version (issue 51)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from mlflow_helpers import MlflowServer, running_mlflow  # noqa: E402
from stack_helpers import tiny_checkpoint  # noqa: E402

pytestmark = pytest.mark.mlflow_server

STEPS = ("experiment", "run", "log", "model", "registered_model", "version", "alias", "end")


class Interrupted(Exception):
    pass


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    with running_mlflow(tmp_path_factory.mktemp("mlflow")) as server:
        yield server


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from t3ar.export import export_checkpoint

    folder = tmp_path_factory.mktemp("model")
    ckpt = tiny_checkpoint(folder / "model.pt")
    export_checkpoint(ckpt, "onnx", folder / "model.onnx")
    return ckpt, folder / "model.onnx"


def _submission(job_id: str, ckpt: Path, onnx_path: Path, name: str) -> object:
    from t3ar.export.probe import generated_images
    from t3ar_services.api.modelreg.mlflow_ops import Submission

    report = ckpt.with_name("report.json")
    report.write_text(json.dumps({"job_id": job_id}))
    return Submission(job_id=job_id, name=name, experiment="t3ar-tests", params={"method": "t3ar", "job_id": job_id},
                      metrics={"accuracy.after.top1": 0.5, "steps": 3.0},
                      tags={"t3ar.team": "vision", "t3ar.winner": "t3ar"},
                      files={"": [report], "checkpoint": [ckpt]}, onnx_path=onnx_path,
                      example=generated_images(4, 32).permute(0, 2, 3, 1).contiguous().numpy(), alias="challenger",
                      pip_requirements=["onnx", "onnxruntime"])


def test_pyfunc_top1_agrees_with_the_checkpoint(mlflow_server: MlflowServer, exported: tuple[Path, Path],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow.pyfunc

    from t3ar.export.parity import reference_logits
    from t3ar.export.probe import generated_images
    from t3ar.models.checkpoint import load_checkpoint
    from t3ar_services.api.modelreg.mlflow_ops import register

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)
    ckpt, onnx_path = exported
    done = register(mlflow_server.url, _submission("job-pyfunc", ckpt, onnx_path, "vision.t3ar-tiny"))  # type: ignore[arg-type]
    assert done.version == "1"

    images = generated_images(64, 32, seed=7)  # not the input example's images
    model, info = load_checkpoint(ckpt)
    expected = reference_logits(model, info.spec, images).argmax(axis=1)
    nhwc = images.permute(0, 2, 3, 1).contiguous().numpy()
    for uri in (f"models:/{done.name}/{done.version}", f"models:/{done.name}@challenger"):
        out = mlflow.pyfunc.load_model(uri).predict(nhwc)
        logits = np.asarray(out["logits"] if isinstance(out, dict) else out)
        assert (logits.argmax(axis=1) == expected).mean() == 1.0, uri


def test_twenty_interrupted_registrations_make_one_run_and_one_version(
        mlflow_server: MlflowServer, exported: tuple[Path, Path]) -> None:
    from t3ar_services.api.modelreg.mlflow_ops import client, find_run, register

    ckpt, onnx_path = exported
    sub = _submission("job-retried", ckpt, onnx_path, "vision.t3ar-retried")
    seen: list[str] = []
    interrupted = 0
    for attempt in range(20):  # each attempt stops at another step (some after the version was made), then retries
        stop_at = STEPS[attempt % len(STEPS)]

        def interrupt(step: str, stop_at: str = stop_at) -> None:
            seen.append(step)
            if step == stop_at:
                raise Interrupted(step)

        try:  # once the model is logged, its steps are found done and no longer taken (not interrupted then)
            register(mlflow_server.url, sub, on_step=interrupt)  # type: ignore[arg-type]
        except Interrupted:
            interrupted += 1
    assert interrupted >= 15 and {"log", "model", "version", "alias", "end"} <= set(seen)
    results = {register(mlflow_server.url, sub).version for _ in range(3)}  # type: ignore[arg-type]
    c = client(mlflow_server.url)
    versions = c.search_model_versions("name = 'vision.t3ar-retried'")
    assert len(versions) == 1 and results == {versions[0].version}
    exp = c.get_experiment_by_name("t3ar-tests")
    runs = c.search_runs([exp.experiment_id], filter_string="tags.`t3ar.job_id` = 'job-retried'")
    assert len(runs) == 1 and find_run(c, exp.experiment_id, "job-retried").info.run_id == runs[0].info.run_id
    assert runs[0].info.status == "FINISHED"
    assert c.get_model_version_by_alias("vision.t3ar-retried", "challenger").version == versions[0].version

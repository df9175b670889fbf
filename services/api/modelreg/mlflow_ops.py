"""The calls to an MLflow tracking server that register one job (:func:`register`) and tag versions later
(:func:`set_version_tags`). Every step first looks for what an earlier, interrupted attempt made, so a retry never
makes a second run or a second version:

1. the experiment, by name (made once; a concurrent maker's wins);
2. the job's run: the oldest run of the experiment tagged ``t3ar.job_id`` = the job's id, else a new one;
3. params, metrics and files, logged into that run (the same values again are no change), then the model in MLflow's
   ONNX flavour with an input example and signature; the run's tag ``t3ar.model_uri`` records that it is logged;
4. the registered model (made once), then its version: the one tagged ``t3ar.job_id`` = the job's id, else a new
   one from the run's model; the version is the last thing made, and it is found again by that tag;
5. the alias the job's request named (only that one), and the run ended.

``mlflow`` is imported inside the functions: an API without the ``mlflow`` extra imports this module and never
calls them (registration is off without ``T3AR_MLFLOW_TRACKING_URI``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

JOB_TAG = "t3ar.job_id"
MODEL_URI_TAG = "t3ar.model_uri"  # on the run: its model is logged (the step is not made again)
MODEL_ARTIFACT = "model"  # the logged model's name in the run


@dataclass(frozen=True)
class Submission:
    """What one job registers: ``name`` (the registered model's, team namespace included), the ``alias`` its request
    named (or None), the run's params, metrics and tags (the version gets the tags too), ``files`` (the run's
    artifact folder -> local files), the ONNX graph, a few input images (uint8 NHWC, the graph's input) and the
    version this one re-runs (``supersedes``: ``name/version``, or None)."""

    job_id: str
    name: str
    experiment: str
    params: dict[str, str]
    metrics: dict[str, float]
    tags: dict[str, str]
    files: dict[str, list[Path]]
    onnx_path: Path
    example: np.ndarray
    alias: str | None = None
    supersedes: str | None = None
    description: str = ""
    pip_requirements: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Registered:
    """Where a job's registration ended: its run, its version, and the model's URI in the registry."""

    experiment_id: str
    run_id: str
    name: str
    version: str

    @property
    def model_uri(self) -> str:
        return f"models:/{self.name}/{self.version}"


def client(tracking_uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


def _quoted(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _experiment(c: Any, name: str) -> str:
    from mlflow.exceptions import MlflowException

    exp = c.get_experiment_by_name(name)
    if exp is not None:
        return str(exp.experiment_id)
    try:
        return str(c.create_experiment(name))
    except MlflowException:  # made meanwhile by another caller
        exp = c.get_experiment_by_name(name)
        if exp is None:
            raise
        return str(exp.experiment_id)


def find_run(c: Any, experiment_id: str, job_id: str) -> Any | None:
    """The job's run (the oldest tagged with its id), or None."""
    runs = c.search_runs([experiment_id], filter_string=f"tags.`{JOB_TAG}` = {_quoted(job_id)}",
                         order_by=["attributes.start_time ASC"], max_results=5)
    return runs[0] if runs else None


def find_version(c: Any, name: str, job_id: str) -> Any | None:
    """The registered version of ``name`` made by the job (tagged with its id), or None."""
    found = c.search_model_versions(f"name = {_quoted(name)} and tags.`{JOB_TAG}` = {_quoted(job_id)}")
    return min(found, key=lambda v: int(v.version)) if found else None


def _log_model(tracking_uri: str, run_id: str, sub: Submission) -> str:
    """The ONNX graph in MLflow's ONNX flavour, with the input example and the signature onnxruntime gives it; the
    logged model's URI."""
    import mlflow
    import mlflow.onnx
    import onnx
    import torch
    from mlflow.models import infer_signature

    from t3ar.export.parity import onnx_logits

    graph = onnx.load(str(sub.onnx_path))
    logits = onnx_logits(sub.onnx_path.read_bytes(), torch.from_numpy(sub.example).permute(0, 3, 1, 2))
    signature = infer_signature(sub.example, logits)
    mlflow.set_tracking_uri(tracking_uri)
    with mlflow.start_run(run_id=run_id):
        info = mlflow.onnx.log_model(graph, name=MODEL_ARTIFACT, input_example=sub.example, signature=signature,
                                     pip_requirements=sub.pip_requirements or None)
    return str(info.model_uri)


def register(tracking_uri: str, sub: Submission, *, on_step: Callable[[str], None] | None = None) -> Registered:
    """Register ``sub`` (see the module docstring); each step is announced to ``on_step`` before it is made (the
    tests interrupt attempts there)."""
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.exceptions import MlflowException

    step = on_step or (lambda _name: None)
    c = client(tracking_uri)
    step("experiment")
    experiment_id = _experiment(c, sub.experiment)
    step("run")
    run = find_run(c, experiment_id, sub.job_id)
    if run is None:
        run = c.create_run(experiment_id, run_name=f"t3ar-{sub.job_id[:12]}", tags={JOB_TAG: sub.job_id, **sub.tags})
    run_id = run.info.run_id
    model_uri = run.data.tags.get(MODEL_URI_TAG)
    if model_uri is None:
        step("log")
        c.log_batch(run_id, params=[Param(k, v) for k, v in sub.params.items()],
                    metrics=[Metric(k, float(v), 0, 0) for k, v in sub.metrics.items()],
                    tags=[RunTag(k, v) for k, v in sub.tags.items()])
        for folder, paths in sub.files.items():
            for path in paths:
                c.log_artifact(run_id, str(path), artifact_path=folder or None)
        step("model")
        model_uri = _log_model(tracking_uri, run_id, sub)
        c.set_tag(run_id, MODEL_URI_TAG, model_uri)
    step("registered_model")
    try:
        c.get_registered_model(sub.name)
    except MlflowException:
        try:
            c.create_registered_model(sub.name, tags={"t3ar.team": sub.tags.get("t3ar.team", "")},
                                      description="adapted by t3ar (test-time adaptation with retrieval)")
        except MlflowException:  # made meanwhile
            c.get_registered_model(sub.name)
    step("version")
    version = find_version(c, sub.name, sub.job_id)
    if version is None:
        tags = {JOB_TAG: sub.job_id, **sub.tags}
        if sub.supersedes:
            tags["t3ar.supersedes"] = sub.supersedes
        model_id = model_uri.rsplit("/", 1)[-1] if model_uri.startswith("models:/m-") else None  # MLflow 3's
        version = c.create_model_version(sub.name, model_uri, run_id=run_id, tags=tags, description=sub.description,
                                         model_id=model_id)
    number = str(version.version)
    if sub.alias:
        step("alias")
        c.set_registered_model_alias(sub.name, sub.alias, number)
    step("end")
    if c.get_run(run_id).info.status == "RUNNING":
        c.set_terminated(run_id, "FINISHED")
    return Registered(experiment_id, run_id, sub.name, number)


def set_version_tags(tracking_uri: str, name: str, version: str, tags: dict[str, str]) -> None:
    """Set ``tags`` on one version (setting a tag again to its value is no change: retries are safe)."""
    c = client(tracking_uri)
    for key, value in tags.items():
        c.set_model_version_tag(name, version, key, value)

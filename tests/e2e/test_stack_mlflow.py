"""The MLflow model registry on the real stack (issue 51): `t3ar up` with T3AR_MLFLOW_TRACKING_URI pointing at a real
MLflow tracking server (tests/e2e/mlflow_helpers.py). A finished job registers one version, with its run's params,
tags and files, which pyfunc serves with the checkpoint's top-1; a withdrawal tags it stale and the re-run's version
links back; a registry stopped while a job runs leaves the job finished and the registration retried to success;
two teams' models stay under their own names. Credentials in the API's environment are never shown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mlflow_helpers import MlflowServer, running_mlflow
from stack_helpers import (
    CLASSES,
    ROOT,
    Stack,
    inherited_path,
    png,
    running_stack,
    target_zip,
    tiny_checkpoint,
    wait_for,
)

from t3ar.clients.api import ApiClient
from t3ar.clients.api_models import JobOut, Registration

pytestmark = [pytest.mark.mlflow_server, pytest.mark.slow]  # a stack and an MLflow server of its own: minutes

JOB = {"method": "t3ar", "epochs": 1, "batch_size": 4, "bank_size": 64, "retrieval": {"k": 2, "r": 2}}
PASSWORD = "pw-never-shown-7f3a"  # MLFLOW_TRACKING_PASSWORD in the API's environment (the server ignores it)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    with running_mlflow(tmp_path_factory.mktemp("mlflow")) as server:
        yield server


@pytest.fixture(scope="module")
def mstack(registry: MlflowServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    env = {"T3AR_MLFLOW_TRACKING_URI": registry.url, "T3AR_MLFLOW_BACKOFF_S": "0.5", "T3AR_MLFLOW_BACKOFF_MAX_S": "2",
           "T3AR_MLFLOW_MAX_ATTEMPTS": "100", "T3AR_MLFLOW_EXPERIMENT": "t3ar-e2e",
           "MLFLOW_TRACKING_USERNAME": "t3ar-user", "MLFLOW_TRACKING_PASSWORD": PASSWORD}
    with running_stack(tmp_path_factory.mktemp("mstack"), env) as st:
        rng = np.random.default_rng(1)
        with st.retriever() as rc:
            rc.add_images([(f"pool-{i}.png", png(CLASSES[i % 3], rng)) for i in range(24)], source="e2e",
                          duplicate_policy="keep")
        yield st


@pytest.fixture(scope="module")
def base(mstack: Stack, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Path]:
    folder = tmp_path_factory.mktemp("base")
    ckpt = tiny_checkpoint(folder / "tiny.pt")
    with mstack.api() as api:
        model_id = api.upload_model(ckpt, "tiny").id
    return ckpt, model_id, target_zip(folder / "target.zip")


def _registered(api: ApiClient, job_id: str, timeout: float = 300) -> JobOut:
    def done() -> JobOut | None:
        job = api.job(job_id)
        reg = job.registration
        assert reg is not None and reg.state in ("pending", "done"), reg
        return job if reg.state == "done" and reg.tags_pending == 0 else None

    return wait_for(done, timeout, f"job {job_id}'s MLflow registration", interval=1.0)  # type: ignore[no-any-return]


def _client(registry: MlflowServer) -> Any:
    from t3ar_services.api.modelreg.mlflow_ops import client

    return client(registry.url)


def test_registers_a_version_that_withdrawal_marks_stale_and_the_rerun_supersedes(
        mstack: Stack, registry: MlflowServer, base: tuple[Path, str, Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow.pyfunc

    from t3ar.export.parity import reference_logits
    from t3ar.export.probe import images_for_parity
    from t3ar.models.checkpoint import load_checkpoint

    ckpt, model_id, target = base
    with mstack.api() as api, mstack.api("admin") as admin:
        first = api.adapt(target, model_id, JOB, register_alias="challenger")
        assert api.wait(first.id, poll=0.3, timeout=240).status == "finished"
        reg = _registered(api, first.id).registration
        assert isinstance(reg, Registration)
        assert reg.name == "default.t3ar-tiny" and reg.version == "1" and reg.alias == "challenger"
        assert reg.model_uri == "models:/default.t3ar-tiny/1" and reg.run_url and reg.version_url
        assert reg.run_url.startswith(registry.url) and PASSWORD not in reg.model_dump_json()

        c = _client(registry)
        version = c.get_model_version(reg.name, reg.version)
        assert version.tags["t3ar.job_id"] == first.id and version.tags["t3ar.team"] == "default"
        assert c.get_model_version_by_alias(reg.name, "challenger").version == "1"
        run = c.get_run(reg.run_id)
        assert run.data.params["job_id"] == first.id and run.data.params["method"] == "t3ar"
        assert run.data.params["base_model_id"] == model_id and run.data.params["winner_rule"] == "none"
        assert run.data.tags["t3ar.pool_items"].split()[0] == str(api.job(first.id).result.pool_ids_used)
        assert "accuracy.after.top1" in run.data.metrics and "steps" in run.data.metrics
        files = {f.path for f in c.list_artifacts(reg.run_id)} | {f.path for f in c.list_artifacts(reg.run_id,
                                                                                                    "checkpoint")}
        assert {"report.json", "lineage.json", "checkpoint/model.pt"} <= files
        lineage = json.loads(Path(c.download_artifacts(reg.run_id, "lineage.json", str(tmp_path))).read_text())
        assert all(item["source"] == "e2e" and item["label"] is None for item in lineage["pool_items"])

        # the registered model serves the checkpoint's top-1 on the job's own target images
        monkeypatch.setenv("MLFLOW_TRACKING_URI", registry.url)
        mlflow.set_tracking_uri(registry.url)  # this process' URI may be another server's (an earlier test module's)
        images, _ = images_for_parity(32, target, 16)
        model, info = load_checkpoint(api.download_checkpoint(first.id, tmp_path / "first.pt"))
        out = mlflow.pyfunc.load_model(reg.model_uri).predict(images.permute(0, 2, 3, 1).contiguous().numpy())
        assert (np.asarray(out["logits"]).argmax(1) == reference_logits(model, info.spec, images).argmax(1)).all()

        # a withdrawal reaches the registry: the version is tagged stale with the item and the time
        victim = info.lineage.pool_ids[0]
        admin.delete_pool_item(victim)
        wait_for(lambda: c.get_model_version(reg.name, "1").tags.get("t3ar.stale") == "true", 60, "the stale tag")
        tags = c.get_model_version(reg.name, "1").tags  # the flag is set last: the item's tag is there already
        mark = tags[f"t3ar.stale.item.{victim}"]
        assert mark.startswith("withdrawn ") and mark.endswith("(delete)") and tags["t3ar.stale.count"] == "1"
        assert api.job(first.id).registration.stale  # type: ignore[union-attr]

        # the re-run registers under the same name, without the alias (it was not asked for), and links both ways
        again = api.readapt(first.id)
        assert api.wait(again.id, poll=0.3, timeout=240).status == "finished"
        reg2 = _registered(api, again.id).registration
        assert reg2 is not None and reg2.name == reg.name and reg2.version == "2" and reg2.alias is None
        assert c.get_model_version(reg.name, "2").tags["t3ar.supersedes"] == f"{reg.name}/1"
        wait_for(lambda: c.get_model_version(reg.name, "1").tags.get("t3ar.superseded_by") == f"{reg.name}/2", 60,
                 "the superseded_by tag")
        assert c.get_model_version_by_alias(reg.name, "challenger").version == "1"
        assert api.job(first.id).registration.superseded_by == f"{reg.name}/2"  # type: ignore[union-attr]
        assert len(c.search_model_versions(f"name = '{reg.name}'")) == 2  # nothing deleted, nothing doubled

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "shared"), str(ROOT), *inherited_path()]),
               T3AR_API_URL=mstack.info["api_url"], T3AR_API_TOKEN=mstack.info["tokens"]["api_token"])
    shown = subprocess.run([sys.executable, "-m", "t3ar.cli.main", "jobs", "show", first.id], capture_output=True,
                           text=True, env=env, cwd=ROOT, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert f"MLflow: registered {reg.model_uri} (alias challenger)" in shown.stdout
    assert "STALE" in shown.stdout and f"superseded by {reg.name}/2" in shown.stdout


def test_a_registry_down_mid_job_leaves_the_job_finished_and_the_registration_retried(
        mstack: Stack, registry: MlflowServer, base: tuple[Path, str, Path]) -> None:
    _, model_id, target = base
    with mstack.api() as api:
        registry.stop()
        try:
            job = api.adapt(target, model_id, JOB, register_as="offline-then-back")
            assert api.wait(job.id, poll=0.3, timeout=240).status == "finished"  # whatever the registry does
            failing = wait_for(lambda: (r := api.job(job.id).registration) is not None and r.attempts >= 2 and r,
                               120, "two failed attempts")
            assert failing.state == "pending" and failing.error and failing.next_attempt_at
            assert PASSWORD not in failing.error
        finally:
            registry.start()
        reg = _registered(api, job.id).registration
        assert reg is not None and reg.name == "default.offline-then-back" and reg.version == "1"
        assert reg.attempts >= 3 and reg.error is None
    assert len(_client(registry).search_model_versions("name = 'default.offline-then-back'")) == 1
    assert PASSWORD not in (mstack.data_dir / "logs" / "api.log").read_text(errors="replace")


def test_two_teams_register_under_their_own_names(mstack: Stack, registry: MlflowServer,
                                                  base: tuple[Path, str, Path]) -> None:
    ckpt, _, target = base
    with mstack.api("admin") as admin:
        keys = {team: admin.create_key(team, "submit").key for team in ("vision", "audio")}
    jobs = {}
    for team, key in keys.items():
        with ApiClient(mstack.info["api_url"], key, retries=2) as api:
            model_id = api.upload_model(ckpt, "tiny").id
            jobs[team] = api.adapt(target, model_id, {"method": "source"}, register_as="cats").id
    for team, key in keys.items():
        with ApiClient(mstack.info["api_url"], key, retries=2) as api:
            assert api.wait(jobs[team], poll=0.3, timeout=240).status == "finished"
            reg = _registered(api, jobs[team]).registration
            assert reg is not None and reg.name == f"{team}.cats" and reg.version == "1"
    c = _client(registry)
    for team in keys:
        (version,) = c.search_model_versions(f"name = '{team}.cats'")
        assert version.tags["t3ar.team"] == team and version.tags["t3ar.job_id"] == jobs[team]

"""The MLflow registry's pure parts and its registrar without a server (issue 51): names in team namespaces and
aliases checked, credentials scrubbed, the payload's params / metrics / tags, and the registrar's retries, backoff,
skips and stale marks with the MLflow calls replaced (the real server: tests/integration/test_mlflow_registry.py,
tests/e2e/test_stack_mlflow.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from t3ar.errors import InvalidInputError
from t3ar_services.api.modelreg import mlflow_ops
from t3ar_services.api.modelreg.payload import build, pool_digest
from t3ar_services.api.modelreg.records import RegistrationStore
from t3ar_services.api.modelreg.registrar import Hooks, Registrar
from t3ar_services.api.modelreg.settings import MlflowSettings, check_alias, check_name, registered_name, scrub
from t3ar_services.api.store import Store


def test_names_are_namespaced_by_team_and_aliases_checked() -> None:
    assert registered_name(register_as=None, base_model_name="EfficientNet Lite0 (ImageNet)", team="vision") == \
        "vision.t3ar-EfficientNet-Lite0-ImageNet"
    assert registered_name(register_as="cats", base_model_name="x", team="audio") == "audio.cats"
    assert check_name("cats-v2.1") == "cats-v2.1" and check_alias("challenger") == "challenger"
    for bad in ("", "a/b", "../x", "x" * 101, "-x"):
        with pytest.raises(InvalidInputError):
            check_name(bad)
    for bad in ("latest", "v3", "V12", "a b", "x" * 65, ""):
        with pytest.raises(InvalidInputError):
            check_alias(bad)


def test_scrub_removes_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "hunter2-secret")
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "tok-abcdef")
    text = scrub("401 for https://bob:hunter2-secret@mlflow.example/api with Bearer tok-abcdef",
                 "https://bob:hunter2-secret@mlflow.example")
    assert "hunter2" not in text and "tok-abcdef" not in text and "bob:" not in text and "mlflow.example" in text
    assert MlflowSettings(tracking_uri="https://bob:pw@mlflow.example/").links_base() == "https://***@mlflow.example"


def test_backoff_doubles_up_to_its_cap() -> None:
    s = MlflowSettings(tracking_uri="http://x", backoff_s=2, backoff_max_s=30)
    assert [s.backoff(n) for n in range(1, 7)] == [2, 4, 8, 16, 30, 30]


def test_payload_carries_what_the_issue_lists() -> None:
    report = {"method": "t3ar", "mode": "test", "config": {"method": "t3ar", "fraction": 0.5, "seed": 3,
                                                           "retrieval": {"k": 5}},
              "parent_id": "p1", "metrics": {"steps": 12, "seconds_adapt": 1.5}, "seconds_total": 4.0,
              "accuracy": {"before": {"top1": 0.25}, "after": {"top1": 0.75}},
              "phases": {"adapting": 2.0, "queue_wait": 0.1},
              "acceptance": {"rule": "paired", "winner": "bn-adapt", "candidates": [
                  {"name": "bn-adapt", "top1": 0.8, "ci": [0.7, 0.9], "vs_source": {"points": 5.0, "lo": 1, "hi": 9}},
                  {"name": "source", "top1": 0.75, "ci": [0.6, 0.85]}]}}
    lineage = {"pool_ids": ["b", "a"], "target_sha256": "t" * 64, "checkpoint_sha256": "c" * 64}
    p = build(report, lineage, job_id="j1", base_model_id="m1", base_model_name="tiny", base_model_sha256="s" * 64,
              team="vision", items={"a": {"source": "web", "label": "cat"}})
    assert p.params["config.retrieval.k"] == "5" and p.params["fraction"] == "0.5" and p.params["seed"] == "3"
    assert p.params["winner_rule"] == "paired" and p.params["target_sha256"] == "t" * 64
    assert p.params["base_model_sha256"] == "s" * 64 and p.params["mode"] == "test" and p.params["job_id"] == "j1"
    assert p.metrics["acceptance.bn-adapt.top1"] == 0.8 and p.metrics["acceptance.bn-adapt.ci_lo"] == 0.7
    assert p.metrics["acceptance.bn-adapt.vs_source.points"] == 5.0
    assert p.metrics["accuracy.before.top1"] == 0.25 and p.metrics["accuracy.after.top1"] == 0.75
    assert p.metrics["steps"] == 12 and p.metrics["phase.adapting.seconds"] == 2.0
    assert p.tags == {"t3ar.job_id": "j1", "t3ar.base_model": "tiny (m1)", "t3ar.winner": "bn-adapt",
                      "t3ar.pool_items": f"2 sha256:{pool_digest(['a', 'b'])}", "t3ar.team": "vision",
                      "t3ar.parent_job": "p1"}
    assert p.lineage["pool_items"] == [{"id": "b"}, {"id": "a", "source": "web", "label": "cat"}]


class _Registry:
    """mlflow_ops.register / set_version_tags replaced: fails while ``down``; records what it was given."""

    def __init__(self) -> None:
        self.down = False
        self.registered: list[mlflow_ops.Submission] = []
        self.tags: dict[tuple[str, str], dict[str, str]] = {}

    def register(self, uri: str, sub: mlflow_ops.Submission, *, on_step: Any = None) -> mlflow_ops.Registered:
        if self.down:
            raise ConnectionError(f"cannot reach {uri}")
        self.registered.append(sub)
        return mlflow_ops.Registered("1", f"run-{sub.job_id}", sub.name, str(len(self.registered)))

    def set_version_tags(self, uri: str, name: str, version: str, tags: dict[str, str]) -> None:
        if self.down:
            raise ConnectionError("down")
        self.tags.setdefault((name, version), {}).update(tags)


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Registrar, _Registry, dict[str, str], Store]:
    from t3ar_services.api.store import JobRow

    registry = _Registry()
    monkeypatch.setattr(mlflow_ops, "register", registry.register)
    monkeypatch.setattr(mlflow_ops, "set_version_tags", registry.set_version_tags)
    status: dict[str, str] = {}
    store = Store(tmp_path / "api.sqlite3")
    for job_id, parent in (("j1", None), ("j2", "j1"), ("j3", None)):
        store.add_job(JobRow(job_id, "m1", parent, "2026-01-01", {}, "jobs/x/target", 4, False, 0, "s"))
    registrar = Registrar(MlflowSettings(tracking_uri="http://registry", backoff_s=0.01, backoff_max_s=0.02,
                                         max_attempts=3),
                          RegistrationStore(tmp_path / "api.sqlite3"), store, tmp_path,
                          Hooks(job_status=lambda job_id: status.get(job_id, "queued"), export_onnx=lambda j: tmp_path,
                                pool_items=lambda ids: {}))
    registrar.submission = lambda reg, scratch: mlflow_ops.Submission(  # type: ignore[method-assign]
        reg.job_id, reg.name, "t3ar", {}, {}, {}, {}, tmp_path, None, reg.alias,  # type: ignore[arg-type]
        supersedes=None)
    return registrar, registry, status, store


def test_registrar_waits_for_the_job_retries_with_backoff_and_fails_after_its_attempts(rig: Any) -> None:
    registrar, registry, status, _ = rig
    registrar.request("j1", "default.m", "challenger")
    registrar.request("j3", "default.m", None)
    assert registrar.run_pending() == 0 and registrar.records.get("j1").state == "pending"  # still queued
    status.update(j1="finished", j3="canceled")
    registry.down = True
    registrar.run_pending()
    first = registrar.records.get("j1")
    assert first.state == "pending" and first.attempts == 1 and "cannot reach" in first.error
    assert registrar.records.get("j3").state == "skipped"
    registrar.run_pending()  # not due yet: no attempt
    assert registrar.records.get("j1").attempts == 1
    for _ in range(2):
        time.sleep(0.03)
        registrar.run_pending()
    failed = registrar.records.get("j1")
    assert failed.state == "failed" and failed.attempts == 3 and registry.registered == []
    registry.down = False
    assert registrar.retry("j1") and registrar.run_pending() == 1
    done = registrar.records.get("j1")
    assert done.state == "done" and done.version == "1" and done.error is None
    assert [s.alias for s in registry.registered] == ["challenger"]
    assert registrar.run_pending() == 0 and len(registry.registered) == 1  # done: never registered again


def test_withdrawal_owes_stale_tags_and_a_rerun_links_back(rig: Any) -> None:
    registrar, registry, status, store = rig
    registrar.request("j1", "default.m", None)
    status["j1"] = "finished"
    registrar.run_pending()
    store.index_lineage("j1", ["p1", "p2"], finished_at="2026-01-01", checkpoint_sha256="c")
    registry.down = True
    assert registrar.mark_stale(["p1", "zzz"], "delete") == 1
    registrar.run_pending()  # the registry is down: the tags wait
    assert registry.tags == {} and registrar.records.owed()["j1"]["t3ar.stale"] == "true"
    registry.down = False
    registrar.run_pending()
    tags = registry.tags[("default.m", "1")]
    assert tags["t3ar.stale"] == "true" and tags["t3ar.stale.item.p1"].endswith("(delete)")
    assert tags["t3ar.stale.count"] == "1" and registrar.records.owed() == {}
    registrar.request("j2", "default.m", None)  # j1's re-run
    status["j2"] = "finished"
    registrar.run_pending()
    assert registry.tags[("default.m", "1")]["t3ar.superseded_by"] == "default.m/2"


def test_jobs_show_says_where_the_registration_stands() -> None:
    from t3ar.cli.job_cmd import _summary, registration_line
    from t3ar.clients.api_models import JobOut, Registration

    base = {"id": "j1", "url": "http://api/jobs/j1", "status": "finished", "model_id": "m", "created_at": "2026",
            "config": {"method": "t3ar"}, "target": {"images": 9, "labelled": False, "skipped": 0},
            "contribution": {"requested": False, "status": "not_requested"}}
    assert "MLflow" not in _summary(JobOut.model_validate(base))  # registration off
    pending = Registration(state="pending", name="default.cats", attempts=2, error="ConnectionError: refused",
                           next_attempt_at="2026-12-03T10:00:00+00:00")
    assert registration_line(pending) == ("MLflow: registration pending as default.cats (attempt 2 failed: "
                                          "ConnectionError: refused; next at 2026-12-03T10:00:00+00:00)")
    failed = pending.model_copy(update={"state": "failed", "attempts": 8})
    assert "FAILED after 8 attempt(s): ConnectionError: refused" in registration_line(failed)
    done = Registration(state="done", name="default.cats", alias="challenger", version="3",
                        model_uri="models:/default.cats/3", run_url="http://m/#/experiments/1/runs/r",
                        version_url="http://m/#/models/default.cats/versions/3", stale=True,
                        superseded_by="default.cats/4")
    text = _summary(JobOut.model_validate({**base, "registration": done.model_dump()}))
    assert "MLflow: registered models:/default.cats/3 (alias challenger); STALE" in text
    assert "superseded by default.cats/4" in text and "version http://m/#/models/default.cats/versions/3" in text

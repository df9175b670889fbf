"""The API's worker routes (/internal/...) in-process: FastAPI TestClient, fakeredis, a mocked retriever (the
fixture and helpers of test_api_routes). The worker is simulated: it downloads what the job names, checks the
digests, and uploads a checkpoint and result as a real one does."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
from fastapi.testclient import TestClient
from rq.job import Job
from test_api_routes import ADMIN, USER, _adapt, _archive, _model, _retriever

from t3ar.clients.retriever import RetrieverClient
from t3ar_services.api.main import create_app
from t3ar_services.api.settings import ApiSettings
from t3ar_services.api.transfer import target_tar
from t3ar_services.common.job_contract import SERIALIZER, JobSpec

WORKER = {"Authorization": "Bearer worker-t"}


def as_worker(spec: dict[str, Any]) -> dict[str, str]:
    """The headers of the worker that dequeued the job: the worker token and the job's own secret."""
    return {**WORKER, "X-T3AR-Job-Secret": spec["job_secret"]}


@pytest.fixture()
def env(tmp_path: Path) -> Iterator[tuple[TestClient, Any, Path]]:
    settings = ApiSettings(data_dir=tmp_path / "data", token="user-t", admin_token="admin-t",  # type: ignore[arg-type]
                           worker_token="worker-t", retriever_admin_token="r-admin", validate_threads=0,
                           max_upload_bytes=200_000, max_model_bytes=10_000_000, sweep_interval=3600)
    redis = fakeredis.FakeRedis()
    pool: dict[str, Any] = {"count": 50, "ids": {"p-1", "p-2"}}
    app = create_app(settings, redis=redis)
    app.state.api.retriever = RetrieverClient("http://r", "r-rw", transport=_retriever(pool), retries=0)
    with TestClient(app) as client:
        yield client, redis, settings.data_dir


def _job(client: TestClient, redis: Any, tmp_path: Path, *, start: bool = True) -> tuple[str, dict[str, Any]]:
    job_id = _adapt(client, _model(client, tmp_path), _archive(labels=True), {"method": "tent"}).json()["id"]
    job = Job.fetch(job_id, connection=redis, serializer=SERIALIZER)
    if start:
        job.set_status("started")  # as a worker does when it takes the job
    return job_id, dict(job.args[0])


def adapted(data: Path, tmp_path: Path, job_id: str, spec: dict[str, Any],
            **lineage: Any) -> tuple[bytes, str, dict[str, Any]]:
    """What a worker uploads for the job: a t3ar checkpoint of the base model (``tmp_path/m.pt``, made by
    ``_model``) carrying the job's config and a lineage of its base model and target images (``lineage``
    overrides fields); (file bytes, sha256, the result's lineage)."""
    from t3ar.data.datasets import adapted_rows
    from t3ar.data.target import read_target
    from t3ar.models.checkpoint import Lineage, load_checkpoint, save_checkpoint
    from t3ar.pipeline import imageset_sha256

    model, info = load_checkpoint(tmp_path / "m.pt")
    cfg = spec["config"]
    images = read_target(data / "jobs" / job_id / "target")
    used = images.subset(adapted_rows(images.labels, len(images), cfg["fraction"], cfg["seed"], mode=cfg["mode"]))
    fields = {"base_model_sha256": spec["model_sha256"], "target_sha256": imageset_sha256(used),
              "target_size": len(used), "pool_ids": ("p-1",), "method": cfg["method"], **lineage}
    out = tmp_path / f"adapted-{job_id}.pt"
    made = Lineage(**fields)  # one lineage: its created_at is the moment it is made (two could differ)
    sha = save_checkpoint(out, model, info.spec, adapt_config=cfg, lineage=made)
    result_lineage = {"job_id": job_id, "model_id": spec["model_id"], "parent_id": spec.get("parent_id"),
                      "checkpoint_sha256": sha, **made.model_dump(mode="json")}
    return out.read_bytes(), sha, result_lineage


def _result(job_id: str, lineage: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {"report": {"job_id": job_id, "accuracy": None}, "lineage": {**lineage, **changes}}


def test_scopes(env: Any, tmp_path: Path) -> None:
    client, redis, _ = env
    job_id, _ = _job(client, redis, tmp_path)
    assert client.get("/internal/ping", headers=WORKER).json() == {"ok": True, "queue": "t3ar-adapt"}
    for headers in (USER, ADMIN):  # the user and admin tokens do not open the worker routes...
        for method, path in (("GET", f"/internal/jobs/{job_id}/target"), ("GET", "/internal/ping"),
                             ("PUT", f"/internal/jobs/{job_id}/checkpoint?sha256={'0' * 64}")):
            resp = client.request(method, path, headers=headers, content=b"x" if method == "PUT" else None)
            assert resp.status_code == 403, (method, path, resp.text)
            assert "T3AR_API_WORKER_TOKEN" in resp.json()["error"]["message"]
    # ...and the worker token opens nothing else
    for method, path in (("GET", "/jobs"), ("GET", f"/jobs/{job_id}/checkpoint"), ("DELETE", "/pool/p-1")):
        assert client.request(method, path, headers=WORKER).status_code == 403, (method, path)
    assert client.get("/internal/ping").status_code == 401
    assert client.put(f"/internal/jobs/{job_id}/checkpoint?sha256={'0' * 64}", content=b"x",
                      headers={"Authorization": "Bearer nope"}).status_code == 401
    assert "/internal/jobs/{job_id}/checkpoint" in client.get("/openapi.json").json()["paths"]


def test_a_job_without_a_secret_opens_nothing(env: Any, tmp_path: Path) -> None:
    """The job secret is mandatory: the worker token alone opens no job, a job record cannot be stored without
    the secret's digest, and the job payload cannot leave the secret out."""
    import sqlite3

    client, redis, _ = env
    job_id, spec = _job(client, redis, tmp_path)
    for method, path in (("GET", f"/internal/jobs/{job_id}/target"), ("GET", f"/internal/jobs/{job_id}/base-model")):
        assert client.request(method, path, headers=WORKER).status_code == 403, (method, path)
        assert client.request(method, path, headers=as_worker(spec)).status_code == 200, (method, path)
    store = client.app.state.api.store  # type: ignore[attr-defined]
    with pytest.raises(sqlite3.IntegrityError):
        store._db.execute("UPDATE jobs SET secret_sha256 = NULL WHERE id = ?", (job_id,))
    with pytest.raises(ValueError, match="job_secret"):
        JobSpec.model_validate({k: v for k, v in spec.items() if k != "job_secret"})


def test_inputs_match_the_job_digests(env: Any, tmp_path: Path) -> None:
    client, redis, data = env
    job_id, spec = _job(client, redis, tmp_path)
    W = as_worker(spec)
    target = client.get(f"/internal/jobs/{job_id}/target", headers=W)
    assert target.status_code == 200 and target.headers["content-type"] == "application/x-tar"
    assert hashlib.sha256(target.content).hexdigest() == spec["target_sha256"] == target.headers["x-checksum-sha256"]
    with tarfile.open(fileobj=io.BytesIO(target.content)) as tf:
        assert "labels.csv" in tf.getnames() and all(m.mtime == 0 and m.uid == 0 for m in tf.getmembers())
    model = client.get(f"/internal/jobs/{job_id}/base-model", headers=W)
    assert hashlib.sha256(model.content).hexdigest() == spec["model_sha256"]
    assert client.get("/internal/jobs/nope/target", headers=W).status_code == 404
    # the tar is deterministic: made again from the same folder, it has the same digest
    (data / "jobs" / job_id / "target.tar").unlink()
    assert target_tar(data, f"jobs/{job_id}/target").sha256 == spec["target_sha256"]


def test_upload_is_verified_atomic_idempotent_and_final(env: Any, tmp_path: Path) -> None:
    client, redis, data = env
    job_id, spec = _job(client, redis, tmp_path)
    W = as_worker(spec)
    out = data / "artifacts" / job_id
    ckpt, sha, lineage = adapted(data, tmp_path, job_id, spec)
    url = f"/internal/jobs/{job_id}/checkpoint"

    bad = client.put(url, params={"sha256": "0" * 64}, content=ckpt, headers=W)  # corrupted on the way
    assert bad.status_code == 422 and "checksum mismatch" in bad.json()["error"]["message"]
    assert not (out / "model.pt").exists() and not list(out.glob(".incoming-*"))
    early = client.put(f"/internal/jobs/{job_id}/result", json=_result(job_id, lineage), headers=W)
    assert early.status_code == 409 and "checkpoint first" in early.json()["error"]["message"]

    ok = client.put(url, params={"sha256": sha}, content=ckpt, headers=W)
    assert ok.status_code == 200 and ok.json() == {"job_id": job_id, "sha256": sha, "size": len(ckpt), "stored": True}
    assert (out / "model.pt").read_bytes() == ckpt
    mismatch = client.put(f"/internal/jobs/{job_id}/result", json=_result(job_id, lineage, checkpoint_sha256="1" * 64),
                          headers=W)
    assert mismatch.status_code == 409
    # the report is part of the contract (JobReport): one that does not fit is refused, and nothing is written
    for report in ({"job_id": job_id, "not_in_the_contract": 1}, {"job_id": job_id, "version": 99},
                   {"job_id": job_id, "epochs": [{"loss": "high"}]}, {"accuracy": None}):
        refused = client.put(f"/internal/jobs/{job_id}/result", json={**_result(job_id, lineage), "report": report},
                             headers=W)
        assert refused.status_code == 422, (report, refused.text)
        assert sorted(p.name for p in out.iterdir()) == ["model.pt"]
    done = client.put(f"/internal/jobs/{job_id}/result", json=_result(job_id, lineage), headers=W)
    assert done.status_code == 200 and done.json() == {"job_id": job_id, "status": "finished", "stored": True}
    assert client.get("/pool/p-1/lineage", headers=USER).json()["jobs"][0]["job_id"] == job_id
    Job.fetch(job_id, connection=redis, serializer=SERIALIZER).set_status("finished")
    assert client.get(f"/jobs/{job_id}/checkpoint", headers=USER).content == ckpt
    assert client.get(f"/jobs/{job_id}/report", headers=USER).json()["job_id"] == job_id
    assert json.loads((out / "lineage.json").read_text())["checkpoint_sha256"] == sha

    # a worker's retry of the same upload: 200, nothing rewritten; a stale or different one: 409, nothing changed
    again = client.put(url, params={"sha256": sha}, content=ckpt, headers=W)
    assert again.status_code == 200 and again.json()["stored"] is False
    assert client.put(f"/internal/jobs/{job_id}/result", json=_result(job_id, lineage),
                      headers=W).json()["stored"] is False
    other = b"another run's weights"
    stale = client.put(url, params={"sha256": hashlib.sha256(other).hexdigest()}, content=other, headers=W)
    assert stale.status_code == 409 and "cannot be replaced" in stale.json()["error"]["message"]
    assert (out / "model.pt").read_bytes() == ckpt


def test_the_checkpoint_check_compares_the_digest_recorded_at_submission(env: Any, tmp_path: Path,
                                                                          monkeypatch: Any) -> None:
    """A checkpoint adapted to other images than the job's (one image changed) is refused by the digest recorded
    when the target was validated; the check decodes and hashes no image of the target (a tampered lineage:
    test_probe_api's bad worker upload)."""
    import shutil

    import t3ar.data.target as target_module
    from t3ar.data.datasets import adapted_rows
    from t3ar.pipeline import imageset_sha256

    client, redis, data = env
    job_id, spec = _job(client, redis, tmp_path)
    url = f"/internal/jobs/{job_id}/checkpoint"
    other = tmp_path / "other-target"
    shutil.copytree(data / "jobs" / job_id / "target", other)
    first = sorted(p for p in other.iterdir() if p.suffix == ".png")[0]
    first.write_bytes(first.read_bytes() + b"\0")  # another image under the same name and label
    images = target_module.read_target(other)
    cfg = spec["config"]
    digest = imageset_sha256(images.subset(adapted_rows(images.labels, len(images), cfg["fraction"], cfg["seed"],
                                                        mode=cfg["mode"])))
    assert digest != spec["subsample_sha256"]
    ckpt, sha, _ = adapted(data, tmp_path, job_id, spec, target_sha256=digest)
    refused = client.put(url, params={"sha256": sha}, content=ckpt, headers=as_worker(spec))
    assert refused.status_code == 422 and "target sha256" in refused.json()["error"]["message"], refused.text

    ckpt, sha, _ = adapted(data, tmp_path, job_id, spec)

    def no_decoding(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the checkpoint check read the target again")

    monkeypatch.setattr(target_module, "read_target", no_decoding)
    ok = client.put(url, params={"sha256": sha}, content=ckpt, headers=as_worker(spec))
    assert ok.status_code == 200, ok.text


def test_uploads_only_for_a_running_job(env: Any, tmp_path: Path) -> None:
    client, redis, data = env
    job_id, spec = _job(client, redis, tmp_path, start=False)  # still queued
    W = as_worker(spec)
    body = b"weights"
    resp = client.put(f"/internal/jobs/{job_id}/checkpoint", params={"sha256": hashlib.sha256(body).hexdigest()},
                      content=body, headers=W)
    assert resp.status_code == 409 and "queued" in resp.json()["error"]["message"]
    client.post(f"/jobs/{job_id}/cancel", headers=USER)
    resp = client.put(f"/internal/jobs/{job_id}/checkpoint", params={"sha256": hashlib.sha256(body).hexdigest()},
                      content=body, headers=W)
    assert resp.status_code == 409 and "canceled" in resp.json()["error"]["message"]
    assert not (data / "artifacts" / job_id / "model.pt").exists()


def test_checkpoint_over_the_limit_is_413(env: Any, tmp_path: Path) -> None:
    client, redis, data = env
    job_id, spec = _job(client, redis, tmp_path)
    W = as_worker(spec)
    big = bytes(10_000_001)
    resp = client.put(f"/internal/jobs/{job_id}/checkpoint", params={"sha256": hashlib.sha256(big).hexdigest()},
                      content=big, headers=W)
    assert resp.status_code == 413 and "T3AR_API_MAX_MODEL_BYTES" in resp.json()["error"]["message"]
    streamed = client.put(f"/internal/jobs/{job_id}/checkpoint", params={"sha256": hashlib.sha256(big).hexdigest()},
                          content=(big[i:i + (1 << 20)] for i in range(0, len(big), 1 << 20)), headers=W)
    assert streamed.status_code == 413, streamed.text
    corrupt = client.put(f"/internal/jobs/{job_id}/checkpoint", params={"sha256": "0" * 64}, content=b"x", headers=W)
    assert corrupt.status_code == 422, corrupt.text
    assert not (data / "artifacts" / job_id).exists()  # a refused upload leaves nothing, not even its folder


def test_worker_token_must_differ() -> None:
    with pytest.raises(ValueError, match="T3AR_API_WORKER_TOKEN must differ"):
        ApiSettings(token="a", admin_token="b", worker_token="a")  # type: ignore[arg-type]

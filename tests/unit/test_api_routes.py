"""API routes in-process: FastAPI TestClient, fakeredis for the queue, a mocked retriever (httpx MockTransport).
No worker runs here; job outcomes are simulated by writing what a worker writes."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import httpx
import numpy as np
import pytest
from error_envelope import expect_error
from fastapi.testclient import TestClient
from mode_bound_method import mode_bound_method
from PIL import Image
from retriever_answers import stats_json
from rq import Queue
from rq.job import Job

from t3ar.clients.retriever import RetrieverClient
from t3ar.models.backbones import BackboneSpec
from t3ar.models.checkpoint import save_checkpoint
from t3ar.models.classifier import ModelSpec, build_classifier
from t3ar_services.api.jobs import explain_failure
from t3ar_services.api.main import create_app, sweep_once
from t3ar_services.api.settings import ApiSettings
from t3ar_services.common import withdrawn
from t3ar_services.common.job_contract import CANCEL_KEY, SERIALIZER, write_json_atomic

USER, ADMIN = {"Authorization": "Bearer user-t"}, {"Authorization": "Bearer admin-t"}


def _retriever(pool: dict[str, Any]) -> httpx.MockTransport:
    def handle(req: httpx.Request) -> httpx.Response:
        pool.setdefault("raw_paths", []).append(req.url.raw_path.decode())
        if req.url.path == "/stats":
            return httpx.Response(200, json=stats_json(pool["count"]))
        if req.url.path == "/ready":
            return httpx.Response(200, json={"ready": True})
        if req.method == "DELETE":
            pid = req.url.path.rsplit("/", 1)[1]
            if pid not in pool["ids"]:
                return httpx.Response(404, json={"error": {"code": "not_found", "message": f"no item {pid}"}})
            pool["ids"].remove(pid)
            assert req.headers["authorization"] == "Bearer r-admin"
            pool.setdefault("withdrawn", set()).add(pid)
            return httpx.Response(200, json={"deleted": [pid], "not_found": []})
        if req.method == "POST" and req.url.path.startswith("/pool/withdrawn/") and req.url.path.endswith("/readmit"):
            pid = req.url.path.split("/")[3]
            if pid not in pool.get("withdrawn", ()):
                return httpx.Response(404, json={"error": {"code": "not_found", "message": f"no withdrawn {pid}"}})
            pool["withdrawn"].remove(pid)
            return httpx.Response(200, json={"id": pid, "sha256": "ab" * 32,
                                             "withdrawn_at": "2026-01-01T00:00:00+00:00"})
        return httpx.Response(404, json={"error": {"code": "not_found", "message": "?"}})

    return httpx.MockTransport(handle)


@pytest.fixture()
def env(tmp_path: Path) -> Iterator[tuple[TestClient, Any, dict[str, Any], Path]]:
    settings = ApiSettings(data_dir=tmp_path / "data", token="user-t", admin_token="admin-t",  # type: ignore[arg-type]
                           retriever_admin_token="r-admin", validate_threads=0, max_upload_bytes=200_000,
                           sweep_interval=3600)
    redis = fakeredis.FakeRedis()
    pool: dict[str, Any] = {"count": 50, "ids": {"p-1", "p-2"}}
    app = create_app(settings, redis=redis)
    state = app.state.api
    state.retriever = RetrieverClient("http://r", "r-rw", transport=_retriever(pool), retries=0)
    state.retriever_admin = RetrieverClient("http://r", "r-admin", transport=_retriever(pool), retries=0)
    with TestClient(app) as client:
        yield client, redis, pool, settings.data_dir


def _png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _archive(n: int = 4, labels: bool = False) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for i in range(n):
            zf.writestr(f"i{i}.png", _png(i))
        if labels:
            zf.writestr("labels.csv", "path,label\n" + "".join(f"i{i}.png,{'ab'[i % 2]}\n" for i in range(n)))
    return buf.getvalue()


def _model(client: TestClient, tmp_path: Path) -> str:
    spec = ModelSpec(backbone=BackboneSpec(name="mobilenetv2_050", weights="none"), classes=("a", "b"), image_size=32)
    save_checkpoint(tmp_path / "m.pt", build_classifier(spec), spec)
    resp = client.post("/models", files={"file": ("m.pt", (tmp_path / "m.pt").read_bytes())}, headers=USER)
    assert resp.status_code == 201, resp.text
    again = client.post("/models", files={"file": ("m.pt", (tmp_path / "m.pt").read_bytes())}, headers=USER)
    assert again.status_code == 200 and again.json()["id"] == resp.json()["id"]
    return str(resp.json()["id"])


def _adapt(client: TestClient, model_id: str, archive: bytes, config: dict[str, Any]) -> httpx.Response:
    return client.post("/adapt", files={"archive": ("t.zip", archive)},
                       data={"model_id": model_id, "config": json.dumps(config)}, headers=USER)


def test_a_submission_validates_its_config_draws_its_subsample_and_reads_its_model_once(
        env: Any, tmp_path: Path, monkeypatch: Any) -> None:
    """POST /adapt validates the config once, draws the target's subsample once (recorded beside the target and in
    the job: the worker and the checkpoint check use the record) and looks the model up once; so does a readapt
    (its parent's record, no draw)."""
    import collections

    import t3ar.data.sampling as sampling
    from t3ar.method.config import AdaptConfig
    from t3ar_services.api.uploads import SUBSAMPLE_FILE, Subsample

    client, redis, _, data = env
    model_id = _model(client, tmp_path)
    counts: collections.Counter[str] = collections.Counter()

    class CountingValidator:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def validate_python(self, *args: Any, **kwargs: Any) -> Any:
            counts["config validated"] += 1
            return self.inner.validate_python(*args, **kwargs)

        def validate_json(self, *args: Any, **kwargs: Any) -> Any:
            counts["config validated"] += 1
            return self.inner.validate_json(*args, **kwargs)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    def counted(name: str, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return fn(*args, **kwargs)
        return call

    store = client.app.state.api.store  # type: ignore[attr-defined]
    monkeypatch.setattr(AdaptConfig, "__pydantic_validator__", CountingValidator(AdaptConfig.__pydantic_validator__))
    monkeypatch.setattr(sampling, "stratified_subsample", counted("subsample drawn", sampling.stratified_subsample))
    monkeypatch.setattr(store, "get_model", counted("model looked up", store.get_model))
    resp = _adapt(client, model_id, _archive(labels=True), {"method": "tent", "fraction": 0.5, "seed": 3})
    assert resp.status_code == 202, resp.text
    assert counts == {"config validated": 1, "subsample drawn": 1, "model looked up": 1}, counts
    job_id = resp.json()["id"]
    recorded = Subsample.model_validate_json((data / "jobs" / job_id / SUBSAMPLE_FILE).read_bytes())
    spec = Job.fetch(job_id, connection=redis, serializer=SERIALIZER).args[0]
    assert spec["subsample_rows"] == recorded.rows and spec["subsample_sha256"] == recorded.sha256
    assert len(recorded.rows) == 2  # half of the 4 images

    counts.clear()
    again = client.post(f"/jobs/{job_id}/readapt", headers=USER)
    assert again.status_code == 202, again.text
    assert counts == {"config validated": 1, "model looked up": 1}, counts
    spec = Job.fetch(again.json()["id"], connection=redis, serializer=SERIALIZER).args[0]
    assert spec["subsample_rows"] == recorded.rows and spec["subsample_sha256"] == recorded.sha256


def test_adapt_enqueues_json_job(env: Any, tmp_path: Path) -> None:
    client, redis, _, data = env
    model_id = _model(client, tmp_path)
    resp = _adapt(client, model_id, _archive(labels=True), {"method": "t3ar", "k": 3, "epochs": 1})
    assert resp.status_code == 202, resp.text
    body = resp.json()
    assert resp.headers["location"] == body["url"] and body["config"]["mode"] == "train"
    queue = Queue("t3ar-adapt", connection=redis, serializer=SERIALIZER)
    assert queue.job_ids == [body["id"]]
    job = Job.fetch(body["id"], connection=redis, serializer=SERIALIZER)
    spec = job.args[0]
    # no paths: the worker fetches both inputs over HTTP and checks them against these digests
    tar = data / "jobs" / body["id"] / "target.tar"
    assert "model_path" not in spec and "target_dir" not in spec
    assert spec["model_sha256"] == hashlib.sha256((tmp_path / "m.pt").read_bytes()).hexdigest()
    assert spec["target_sha256"] == hashlib.sha256(tar.read_bytes()).hexdigest()
    assert spec["target_bytes"] == tar.stat().st_size
    assert spec["request_id"] == resp.headers["x-request-id"]  # the worker logs under the submitting request's id
    assert job.timeout == 6 * 3600 and job.result_ttl == 30 * 86400 and job.failure_ttl == 30 * 86400
    with tarfile.open(tar) as tf:
        assert sorted(tf.getnames()) == ["i0.png", "i1.png", "i2.png", "i3.png", "labels.csv"]
    assert (data / "jobs" / body["id"] / "target" / "labels.csv").is_file()
    assert not (data / "jobs" / body["id"] / "upload").exists()
    got = client.get(f"/jobs/{body['id']}", headers=USER).json()
    assert got["status"] == "queued" and got["queue_position"] == 0 and got["checkpoint_url"] is None


def test_rejections_leave_nothing(env: Any, tmp_path: Path) -> None:
    client, redis, pool, data = env
    model_id = _model(client, tmp_path)
    pool["count"] = 2
    cases = [
        (_adapt(client, model_id, _archive(), {"k": 5}), 422, "the pool has 2"),
        (_adapt(client, model_id, b"x" * 300_000, {}), 413, "T3AR_API_MAX_UPLOAD_BYTES"),
        (_adapt(client, "nope", _archive(), {}), 404, "no model"),
        (_adapt(client, model_id, _archive(1), {"method": "tent"}), 422, "at least 2"),
        (client.post("/adapt", data={"model_id": model_id}, headers=USER), 422, "archive"),
    ]
    for resp, status, message in cases:
        assert resp.status_code == status, resp.text
        assert message in resp.json()["error"]["message"]
    assert Queue("t3ar-adapt", connection=redis, serializer=SERIALIZER).count == 0
    assert list((data / "jobs").iterdir()) == []
    assert client.get("/jobs", headers=USER).json()["total"] == 0


def test_the_config_enqueued_is_the_config_validated_mode_included(env: Any, tmp_path: Path) -> None:
    """A labelled archive makes a job of a method with a train-time mode a train-time job; an option refused at
    train time is refused then (422) before anything is stored, not accepted and failed by the worker. No product
    option is refused at train time only any more (those that were are the benchmarks' probe switches): a method
    registered for the test has one."""
    client, redis, _, data = env
    model_id = _model(client, tmp_path)
    with mode_bound_method() as name:
        _mode_validated_with_the_config(client, redis, data, model_id, {"method": name, "watch": True}, "watch")


def _mode_validated_with_the_config(client: TestClient, redis: Any, data: Path, model_id: str,
                                    options: dict[str, Any], option: str) -> None:
    resp = _adapt(client, model_id, _archive(labels=True), options)
    assert resp.status_code == 422, resp.text
    assert option in resp.json()["error"]["message"], resp.text
    assert Queue("t3ar-adapt", connection=redis, serializer=SERIALIZER).count == 0
    assert list((data / "jobs").iterdir()) == []
    assert client.get("/jobs", headers=USER).json()["total"] == 0
    # the same options on an unlabelled archive (test time) are a job, whose config says the mode it runs in
    ok = _adapt(client, model_id, _archive(), options)
    assert ok.status_code == 202, ok.text
    spec = Job.fetch(ok.json()["id"], connection=redis, serializer=SERIALIZER).args[0]
    assert spec["config"] == ok.json()["config"] and spec["config"]["mode"] == "test"


def test_archive_of_many_small_compressed_members_is_a_bomb(env: Any, tmp_path: Path) -> None:
    """Members under 1 MiB escape the per-member ratio check; the whole archive's ratio refuses them before
    anything is extracted, naming the offending member and the setting."""
    client, redis, _, data = env
    model_id = _model(client, tmp_path)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for i in range(40):
            zf.writestr(f"z{i:02d}.png", bytes(1_000_000))
    assert len(buf.getvalue()) < 100_000
    resp = _adapt(client, model_id, buf.getvalue(), {})
    assert resp.status_code == 422, resp.text
    error = resp.json()["error"]
    assert error["code"] == "unsafe_archive", error
    assert "rejected: total declared size" in error["message"] and "T3AR_API_MAX_ARCHIVE_RATIO=100" in error["message"]
    assert Queue("t3ar-adapt", connection=redis, serializer=SERIALIZER).count == 0
    assert list((data / "jobs").iterdir()) == []


def test_errors_name_what_the_client_sent_not_server_paths(env: Any, tmp_path: Path) -> None:
    client, _, pool, data = env
    pool["count"] = 50
    hidden = (str(data), str(data.resolve()), ".upload-", "/jobs/", "/target")

    def error(resp: httpx.Response, status: int, code: str) -> str:
        assert resp.status_code == status, resp.text
        body = resp.json()["error"]
        assert body["code"] == code, body
        assert not any(h in body["message"] for h in hidden), body["message"]
        return str(body["message"])

    bad_model = client.post("/models", files={"file": ("mine.pt", b"not a checkpoint" * 10)}, headers=USER)
    assert error(bad_model, 422, "bad_checkpoint").startswith("mine.pt is not a t3ar checkpoint")
    model_id = _model(client, tmp_path)
    members = {"a.png": _png(1), "b.png": _png(2), "sub/c.png": b"garbage"}
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as zf:
        for name, blob in members.items():
            zf.writestr(name, blob)
    assert error(_adapt(client, model_id, zipped.getvalue(), {}), 422, "bad_image").startswith("t.zip/sub/c.png: ")
    with zipfile.ZipFile(zipped, "a") as zf:
        zf.writestr("../evil.png", b"x")
    assert error(_adapt(client, model_id, zipped.getvalue(), {}), 422, "unsafe_archive").startswith(
        "t.zip: member '../evil.png' rejected")
    only_bad = io.BytesIO()
    with zipfile.ZipFile(only_bad, "w") as zf:
        zf.writestr("x.png", b"garbage")
        zf.writestr("y.txt", b"text")
    resp = client.post("/adapt", files={"archive": ("t.zip", only_bad.getvalue())},
                       data={"model_id": model_id, "config": "{}", "skip_bad_images": "true"}, headers=USER)
    assert error(resp, 422, "invalid_input").startswith("t.zip: no readable images")
    with zipfile.ZipFile(only_bad, "a") as zf:
        for i in range(2):
            zf.writestr(f"ok{i}.png", _png(i))
    resp = client.post("/adapt", files={"archive": ("t.zip", only_bad.getvalue())},
                       data={"model_id": model_id, "config": "{}", "skip_bad_images": "true"}, headers=USER)
    assert resp.status_code == 202, resp.text
    warnings = resp.json()["warnings"]
    assert len(warnings) == 2 and not any(h in w for w in warnings for h in hidden), warnings
    assert any(w.startswith("skipped x.png: t.zip/x.png: not a readable image") for w in warnings), warnings


def test_withdrawn_ids_are_forwarded_encoded(env: Any) -> None:
    """Any id reaches the retriever as one encoded path segment; one the pool cannot hold is a 404, not a 500."""
    client, _, pool, _ = env
    for sent, raw in (("%04", "%04"), ("p%3F1", "p%3F1"), ("%2E%2E", "%2E%2E"), ("a%20b", "a%20b")):
        pool["raw_paths"] = []
        resp = client.delete(f"/pool/{sent}", headers=ADMIN)
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found", resp.text
        # the delete, then (on its 404) whether the retriever recorded its withdrawal (issue 50, N5): both encoded
        assert pool["raw_paths"] == [f"/pool/{raw}", f"/pool/withdrawn/{raw}"]
    resp = client.delete("/pool/p-1", headers=ADMIN)
    assert resp.status_code == 200 and resp.json()["deleted"] is True and pool["ids"] == {"p-2"}


def test_over_large_bodies_get_the_json_error_body(tmp_path: Path) -> None:
    """Declared too large (refused before reading) or streamed past the limit: 413 in the JSON error envelope."""
    settings = ApiSettings(data_dir=tmp_path / "data", token="user-t", admin_token="admin-t",  # type: ignore[arg-type]
                           max_upload_bytes=200_000, max_model_bytes=100_000, sweep_interval=3600)
    limit = settings.max_body_bytes
    body = b"x" * (limit + 1)

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(body), 65536):
            yield body[start:start + 65536]

    with TestClient(create_app(settings, redis=fakeredis.FakeRedis())) as client:
        # refused unread whatever the route; streamed, only where the route reads the body
        for declared, paths in ((True, ("/adapt", "/models", "/jobs", "/no/route")), (False, ("/adapt", "/models"))):
            for path in paths:
                headers = {**USER, "Content-Type": "multipart/form-data; boundary=x"}
                resp = client.post(path, headers=headers, content=body if declared else chunks())
                assert resp.status_code == 413, (path, declared, resp.text)
                assert resp.headers["content-type"] == "application/json", (path, declared, resp.headers)
                error = resp.json()["error"]
                says = {"/adapt": "T3AR_API_MAX_UPLOAD_BYTES",
                        "/models": "T3AR_API_MAX_MODEL_BYTES"}.get(path, "few fields")
                assert error["code"] == "payload_too_large" and says in error["message"], error
        assert client.get("/health").status_code == 200
    assert list((settings.data_dir / "jobs").iterdir()) == []


def test_cancel_queued_and_states(env: Any, tmp_path: Path) -> None:
    client, redis, _, _ = env
    model_id = _model(client, tmp_path)
    job_id = _adapt(client, model_id, _archive(), {"method": "tent"}).json()["id"]
    assert client.post(f"/jobs/{job_id}/cancel", headers=USER).json() == {"id": job_id, "status": "canceled"}
    assert redis.exists(CANCEL_KEY.format(job_id=job_id))
    assert client.get(f"/jobs/{job_id}", headers=USER).json()["status"] == "canceled"
    assert client.post(f"/jobs/{job_id}/cancel", headers=USER).status_code == 409
    assert client.get(f"/jobs/{job_id}/checkpoint", headers=USER).status_code == 409


def test_failed_job_error_and_finished_lineage(env: Any, tmp_path: Path) -> None:
    client, redis, pool, data = env
    model_id = _model(client, tmp_path)
    failed = _adapt(client, model_id, _archive(), {"method": "tent"}).json()["id"]
    done = _adapt(client, model_id, _archive(), {"method": "t3ar", "k": 2}).json()["id"]
    job = Job.fetch(failed, connection=redis, serializer=SERIALIZER)
    job.meta["error"] = "DatasetError: something broke"
    job.save_meta()
    job.set_status("failed")
    got = client.get(f"/jobs/{failed}", headers=USER).json()
    assert got["status"] == "failed" and got["error"] == "DatasetError: something broke"
    # what a worker leaves behind when a job finishes
    save_checkpoint(data / "artifacts" / done / "model.pt", *_tiny())
    write_json_atomic(data / "artifacts" / done / "report.json", {"job_id": done, "accuracy": None})
    write_json_atomic(data / "artifacts" / done / "lineage.json", {"pool_ids": ["p-1"], "created_at": "now"})
    Job.fetch(done, connection=redis, serializer=SERIALIZER).set_status("finished")
    assert client.get(f"/jobs/{done}/report", headers=USER).json() == {
        "job_id": done, "accuracy": None, "contribution": {"requested": False, "status": "not_requested"},
        "neighbours_from_contributions": []}  # the API adds what it knows about contributions
    assert client.get(f"/jobs/{done}/checkpoint", headers=USER).content[:2] == b"PK"
    assert client.delete("/pool/p-1", headers=USER).status_code == 403
    out = client.delete("/pool/p-1", headers=ADMIN).json()
    assert [j["job_id"] for j in out["jobs"]] == [done] and out["deleted"]
    assert withdrawn.read(redis, 0).ids == ["p-1"]  # the workers' caches are told
    # recorded like a contribution's withdrawal or a compaction (issue 34: a single delete was not)
    assert client.app.state.api.withdrawer.records.withdrawal_reasons(["p-1"]) == {"p-1": "delete"}
    gone = client.delete("/pool/p-1", headers=ADMIN)
    assert gone.status_code == 404 and "already withdrawn" in gone.json()["error"]["message"]
    # N2 (issue 50): an admin re-admits the withdrawn content (the retriever refuses it at ingest until then), audited
    assert client.post("/pool/p-1/readmit", headers=USER).status_code == 403
    back = client.post("/pool/p-1/readmit", headers=ADMIN)
    assert back.status_code == 200 and back.json()["pool_id"] == "p-1" and back.json()["readmitted"]
    assert client.post("/pool/p-1/readmit", headers=ADMIN).status_code == 404  # once
    rows = client.get("/audit", headers=ADMIN, params={"action": "pool.readmit"}).json()["entries"]
    assert [(r["target"], r["outcome"]) for r in rows] == [("p-1", "ok")]
    assert client.get("/pool/p-1/lineage", headers=USER).json()["jobs"][0]["job_id"] == done
    readapt = client.post(f"/jobs/{done}/readapt", headers=USER)
    assert readapt.status_code == 202 and readapt.json()["parent_id"] == done


def test_a_jobs_config_and_result_are_typed_in_the_answers_and_the_document(env: Any, tmp_path: Path) -> None:
    """GET /jobs/{id} answers the job's config as its method's AdaptConfig (nested groups) and a finished job's
    result as JobResult, and the OpenAPI document says both shapes; a config stored by an earlier version that this
    one no longer reads still answers (its options as stored), as does a result with a field that does not fit."""
    from rq.results import Result

    from t3ar.method.config import AdaptConfig

    client, redis, _, _ = env
    model_id = _model(client, tmp_path)
    accepted = _adapt(client, model_id, _archive(), {"method": "t3ar", "retrieval": {"k": 2}})
    job_id = accepted.json()["id"]
    got = client.get(f"/jobs/{job_id}", headers=USER).json()
    assert got["config"] == accepted.json()["config"] and got["config"]["retrieval"]["k"] == 2
    assert AdaptConfig.model_validate(got["config"]).model_dump(mode="json") == got["config"]
    job = Job.fetch(job_id, connection=redis, serializer=SERIALIZER)
    Result.create(job, Result.Type.SUCCESSFUL, ttl=600, return_value={
        "checkpoint_sha256": "a" * 64, "steps": 7, "winner": "tent", "accuracy_before": 0.5, "accuracy_after": 0.75,
        "labelled_neighbours": [{"pool_id": "p-1", "label": "a", "uses": 2}], "pool_ids_used": "many"})
    job.set_status("finished")
    result = client.get(f"/jobs/{job_id}", headers=USER).json()["result"]
    assert result["steps"] == 7 and result["winner"] == "tent" and result["pool_ids_used"] is None  # left out
    assert result["labelled_neighbours"] == [{"pool_id": "p-1", "label": "a", "uses": 2}]
    store = client.app.state.api.store  # type: ignore[attr-defined]
    with store._tx() as db:  # a config of an earlier version: an option since removed
        db.execute("UPDATE jobs SET config = ? WHERE id = ?",
                   (json.dumps({**got["config"], "gone": {"x": 1}}), job_id))
    old = client.get(f"/jobs/{job_id}", headers=USER)
    assert old.status_code == 200 and old.json()["config"]["gone"] == {"x": 1}
    # a readapt of it: a 409 naming the option, nothing stored or enqueued (it was a 500)
    before = client.get("/jobs", headers=USER).json()
    again = client.post(f"/jobs/{job_id}/readapt", headers=USER)
    message = again.json()["error"]["message"]
    assert again.status_code == 409 and "no longer validates" in message and "gone" in message, again.text
    assert store.reruns_of(job_id) == [] and client.get("/jobs", headers=USER).json() == before
    doc = client.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    for model in ("JobOut", "JobAccepted"):
        shape = json.dumps(schemas[model]["properties"]["config"])
        assert "T3ARConfig" in shape and "TentConfig" in shape and "StoredConfig" in shape, shape
    assert schemas["JobOut"]["properties"]["result"]["anyOf"][0] == {"$ref": "#/components/schemas/JobResult"}


def _tiny() -> tuple[Any, ModelSpec]:
    spec = ModelSpec(backbone=BackboneSpec(name="mobilenetv2_050", weights="none"), classes=("a", "b"), image_size=32)
    return build_classifier(spec), spec


def test_sweep_and_expired_jobs(env: Any, tmp_path: Path) -> None:
    client, redis, _, _ = env
    model_id = _model(client, tmp_path)
    job_id = _adapt(client, model_id, _archive(), {"method": "tent"}).json()["id"]
    Job.fetch(job_id, connection=redis, serializer=SERIALIZER).delete()  # Redis lost the record
    got = client.get(f"/jobs/{job_id}", headers=USER).json()
    assert got["status"] == "failed" and "readapt" in got["error"]
    sweep_once(client.app.state.api)  # type: ignore[attr-defined]


def test_ops_routes(env: Any) -> None:
    client, _, _, _ = env
    assert client.get("/health").json() == {"status": "ok"}
    ready = client.get("/ready")
    assert ready.status_code == 200 and ready.json()["redis"] and ready.json()["retriever"]
    assert "t3ar_api_request_seconds" in client.get("/metrics").text
    assert client.get("/jobs").status_code == 401
    assert client.get("/nope", headers=USER).json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(("text", "expect"), [
    ("Moved to FailedJobRegistry, due to AbandonedJobError", "worker running this job stopped"),
    ("Work-horse terminated unexpectedly; waitpid returned 9", "worker running this job stopped"),
    ("Traceback...\nrq.timeouts.JobTimeoutException: Task exceeded", "timeout (60 s"),
    ("Traceback...\nValueError: boom", "ValueError: boom"), (None, "without an error message"),
])
def test_explain_failure(text: str | None, expect: str) -> None:
    assert expect in explain_failure(text, 60)


def test_explained_failures_name_no_server_directory() -> None:
    text = "Traceback...\nFileNotFoundError: [Errno 2] No such file or directory: '/srv/t3ar/jobs/ab/model.pt'"
    assert explain_failure(text, 60) == "FileNotFoundError: [Errno 2] No such file or directory: 'model.pt'"
    assert "POST /jobs/{id}/readapt" in explain_failure("AbandonedJobError", 60)


def test_forms_refuse_fields_they_do_not_take(env: Any, tmp_path: Path) -> None:
    """A misspelt option must not run a job with defaults: unknown form fields are a 422 naming them, and the
    document closes the forms (additionalProperties: false)."""
    client, _, _, _ = env
    model_id = _model(client, tmp_path)
    resp = client.post("/adapt", files={"archive": ("t.zip", _archive())},
                       data={"model_id": model_id, "confg": '{"method": "tent"}'}, headers=USER)
    expect_error(resp, 422, "invalid_input", "unknown form field(s) 'confg'")
    assert client.get("/jobs", headers=USER).json()["jobs"] == []
    resp = client.post("/models", files={"file": ("m.pt", b"x")}, data={"nmae": "typo"}, headers=USER)
    expect_error(resp, 422, "invalid_input", "unknown form field(s) 'nmae'")
    doc = client.get("/openapi.json").json()
    for path in ("/adapt", "/models"):
        ref = doc["paths"][path]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]["$ref"]
        assert doc["components"]["schemas"][ref.rsplit("/", 1)[1]]["additionalProperties"] is False

"""Issue 29's probe against the API in-process (TestClient, fakeredis, a mocked retriever; the fixture and helpers
of test_api_routes / test_api_worker_routes): configs that cannot be held (F4), scope before body (F9)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from asgi_probe import AsgiProbe
from error_envelope import expect_error
from test_api_routes import USER, _adapt, _archive, _model
from test_api_worker_routes import WORKER, as_worker, env  # noqa: F401 - the fixture

from t3ar_services.api.main import create_app
from t3ar_services.api.settings import ApiSettings


def test_f4_adapt_configs_that_cannot_be_held_are_422(env: Any, tmp_path: Path) -> None:  # noqa: F811
    client, redis, data = env
    model_id = _model(client, tmp_path)
    for config in ('{"temperature": Infinity}', '{"weight_decay": Infinity}', '{"lr": NaN}', '{"lr": 1e999}',
                   '{"k": ' + "9" * 5000 + "}", '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}",
                   '{"method": "\\ud800"}'):
        resp = client.post("/adapt", files={"archive": ("t.zip", _archive())},
                           data={"model_id": model_id, "config": config}, headers=USER)
        expect_error(resp, 422, "invalid_input", "config")
    assert not list((data / "jobs").iterdir())  # nothing was kept
    assert _adapt(client, model_id, _archive(), {"method": "tent", "epochs": 1}).status_code == 202


def _first_receive(app: Any, method: str, path: str, token: str) -> tuple[int, int]:
    """Send one request with a 900 MB declared body straight to the ASGI app; (status, body reads)."""
    probe = AsgiProbe(b"x" * 65536, more_body=True)
    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "scheme": "http", "server": ("t", 80), "client": ("c", 1), "http_version": "1.1",
             "headers": [(b"authorization", f"Bearer {token}".encode()), (b"content-length", b"900000000"),
                         (b"content-type", b"multipart/form-data; boundary=x")]}
    asyncio.run(asyncio.wait_for(app(scope, probe.receive, probe.send), 10))
    return probe.sent[0]["status"], probe.reads


def test_f9_scope_is_checked_before_the_body_is_read(tmp_path: Path) -> None:
    settings = ApiSettings(data_dir=tmp_path / "d", token="user-t", admin_token="admin-t",  # type: ignore[arg-type]
                           worker_token="worker-t", max_upload_bytes=2_000_000_000, max_model_bytes=10)
    app = create_app(settings)
    for method, path, token in (("POST", "/adapt", "worker-t"), ("POST", "/models", "worker-t"),
                                ("PUT", f"/internal/jobs/{'a' * 32}/checkpoint", "user-t"),
                                ("PUT", f"/internal/jobs/{'a' * 32}/result", "admin-t")):
        status, reads = _first_receive(app, method, path, token)
        assert (status, reads) == (403, 0), (method, path, token)
    status, reads = _first_receive(app, "POST", "/adapt", "nope")
    assert (status, reads) == (401, 0)


def test_f9_the_403_names_the_scope(env: Any) -> None:  # noqa: F811
    client, _, _ = env
    resp = client.post("/adapt", headers=WORKER, files={"archive": ("t.zip", b"x")}, data={"model_id": "m"})
    expect_error(resp, 403, "forbidden", "worker token opens only the worker routes")
    resp = client.put(f"/internal/jobs/{'a' * 32}/result", headers=USER, content=json.dumps({}))
    expect_error(resp, 403, "forbidden", "T3AR_API_WORKER_TOKEN")


def _started(client: Any, redis: Any, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    from test_api_worker_routes import _job

    return _job(client, redis, tmp_path)


def test_f3_a_bad_worker_upload_is_refused_whole_and_poisons_nothing(env: Any, tmp_path: Path,  # noqa: F811
                                                                     caplog: Any) -> None:
    import hashlib

    from test_api_routes import ADMIN, _retriever
    from test_api_worker_routes import adapted

    from t3ar.clients.retriever import RetrieverClient

    client, redis, data = env
    pool: dict[str, Any] = {"count": 50, "ids": {"p-1", "p-2", "p-3"}}
    client.app.state.api.retriever_admin = RetrieverClient("http://r", "r-admin", transport=_retriever(pool),
                                                           retries=0)
    job_id, spec = _started(client, redis, tmp_path)
    out = data / "artifacts" / job_id
    url = f"/internal/jobs/{job_id}/checkpoint"
    W = as_worker(spec)

    def put(body: bytes) -> Any:
        return client.put(url, params={"sha256": hashlib.sha256(body).hexdigest()}, content=body, headers=W)

    # random bytes with their correct sha256 are not a checkpoint; nor is one of another base, target or config
    expect_error(put(b"random bytes" * 100), 422, "bad_checkpoint", "not a t3ar checkpoint")
    expect_error(put(adapted(data, tmp_path, job_id, spec, target_sha256="0" * 64)[0]), 422, "bad_checkpoint",
                 "target")
    expect_error(put(adapted(data, tmp_path, job_id, spec, base_model_sha256="1" * 64)[0]), 422, "bad_checkpoint",
                 "base model")
    other = {**spec, "config": {**spec["config"], "lr": spec["config"]["lr"] * 2}}
    expect_error(put(adapted(data, tmp_path, job_id, other)[0]), 422, "bad_checkpoint", "lr")
    assert not (out / "model.pt").exists() and not list(out.glob(".incoming-*"))

    ckpt, sha, lineage = adapted(data, tmp_path, job_id, spec)
    assert put(ckpt).status_code == 200
    result_url = f"/internal/jobs/{job_id}/result"
    for bad in ({**lineage, "created_at": {"an": "object"}}, {**lineage, "pool_ids": ["p-1", "p-2"]},
                {**lineage, "target_size": 999}, {**lineage, "model_id": "another"}):
        resp = client.put(result_url, json={"report": {"job_id": job_id}, "lineage": bad}, headers=W)
        assert resp.status_code == 422, resp.text
    raw = json.dumps({"report": {"job_id": job_id, "method": "SURROGATE"}, "lineage": lineage}).replace("SURROGATE",
                                                                                                      "\\ud800")
    resp = client.put(result_url, content=raw.encode(), headers={**W, "Content-Type": "application/json"})
    # refused whole: by the JSON parser (the body is read after the job's secret is checked) or by the text check
    assert resp.status_code == 422 and resp.json()["error"]["code"] in ("invalid_request", "invalid_input"), resp.text
    resp = client.put(result_url, content=b'{"report": {"job_id": "' + job_id.encode() + b'", "seconds_total": NaN}, '
                      b'"lineage": ' + json.dumps(lineage).encode() + b"}",
                      headers={**W, "Content-Type": "application/json"})
    expect_error(resp, 422, "invalid_input", "finite")
    assert sorted(p.name for p in out.iterdir()) == ["model.pt"]  # nothing else was written
    for pid in ("p-1", "p-9"):
        assert client.get(f"/pool/{pid}/lineage", headers=USER).status_code == 200

    # a record an older API wrote unchecked is skipped (and logged once): lineage and withdrawals keep working
    poisoned = data / "artifacts" / "old-job"
    with caplog.at_level("WARNING"):  # (the API's own sweep may meet the record first: it is logged once either way)
        poisoned.mkdir()
        (poisoned / "lineage.json").write_text(json.dumps({"checkpoint_sha256": "2" * 64, "pool_ids": ["p-1"],
                                                           "created_at": {"an": "object"}}))
        for pid in ("p-1", "p-2", "anything"):
            assert client.get(f"/pool/{pid}/lineage", headers=USER).status_code == 200
    assert sum("old-job" in r.getMessage() for r in caplog.records) == 1
    gone = client.delete("/pool/p-2", headers=ADMIN)
    assert gone.status_code == 200 and gone.json()["deleted"] is True, gone.text

    done = client.put(result_url, json={"report": {"job_id": job_id}, "lineage": lineage}, headers=W)
    assert done.status_code == 200, done.text
    assert client.get("/pool/p-1/lineage", headers=USER).json()["jobs"][0]["job_id"] == job_id


def test_f3_a_delete_done_at_the_retriever_answers_2xx_whatever_fails_after(env: Any, monkeypatch: Any) -> None:  # noqa: F811
    from redis.exceptions import ConnectionError as RedisDown
    from test_api_routes import ADMIN, _retriever

    from t3ar.clients.retriever import RetrieverClient

    client, _, _ = env
    state = client.app.state.api
    pool: dict[str, Any] = {"count": 50, "ids": {"p-1"}}
    state.retriever_admin = RetrieverClient("http://r", "r-admin", transport=_retriever(pool), retries=0)

    def down(*_: Any) -> Any:
        raise RedisDown("redis is down")

    monkeypatch.setattr(state.jobs, "started_ids", down)
    monkeypatch.setattr(state.store, "jobs_using", down)
    resp = client.delete("/pool/p-1", headers=ADMIN)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["deleted"] is True and "could not be read" in body["lineage_error"] and pool["ids"] == set()


def test_f3_a_canceled_jobs_upload_is_cleaned(env: Any, tmp_path: Path) -> None:  # noqa: F811
    import hashlib

    from rq.job import Job
    from test_api_worker_routes import adapted

    from t3ar_services.api.main import sweep_once
    from t3ar_services.common.job_contract import SERIALIZER

    client, redis, data = env
    job_id, spec = _started(client, redis, tmp_path)
    ckpt, sha, _ = adapted(data, tmp_path, job_id, spec)
    assert client.put(f"/internal/jobs/{job_id}/checkpoint", params={"sha256": sha}, content=ckpt,
                      headers=as_worker(spec)).status_code == 200
    assert client.post(f"/jobs/{job_id}/cancel", headers=USER).json()["status"] == "canceling"
    job = Job.fetch(job_id, connection=redis, serializer=SERIALIZER)  # what the worker does when it sees the cancel
    job.meta["canceled"] = True
    job.save_meta()
    job.set_status("failed")
    sweep_once(client.app.state.api)
    assert not (data / "artifacts" / job_id).exists()
    assert hashlib.sha256(ckpt).hexdigest() == sha


def test_f5_every_open_config_field_has_a_bound_named_in_the_422(env: Any, tmp_path: Path) -> None:  # noqa: F811
    client, _, data = env
    model_id = _model(client, tmp_path)
    for field, value, bound in (("min_steps", 10**12, "1000000"), ("min_steps", 1e30, "1000000"),
                                ("bank_size", 10**12, "262144"), ("seed", 2**70, "4294967295"),
                                ("refine_neighbors", 10**9, "1024"), ("train_groups", 10**9, "64"),
                                ("temperature", 1e300, "100"), ("weight_decay", 1e300, "1"), ("seed", -1, "0")):
        resp = _adapt(client, model_id, _archive(), {"method": "t3ar", "k": 1, field: value})
        err = expect_error(resp, 422, "invalid_input", field)
        assert bound in err["message"], (field, err)
    assert not list((data / "jobs").iterdir())


def test_f5_every_numeric_config_field_is_bounded_above() -> None:
    from pydantic.fields import FieldInfo

    from t3ar.method.config import AdaptConfig

    def upper(info: FieldInfo) -> bool:
        return any(getattr(m, "le", None) is not None or getattr(m, "lt", None) is not None for m in info.metadata)

    for name, info in AdaptConfig.model_fields.items():
        kinds = str(info.annotation)
        if ("int" in kinds or "float" in kinds) and "bool" not in kinds:
            assert upper(info), f"AdaptConfig.{name} has no upper bound"


def test_f5_operator_caps_on_steps_and_memory(env: Any, tmp_path: Path) -> None:  # noqa: F811
    client, _, data = env
    state = client.app.state.api
    model_id = _model(client, tmp_path)
    state.settings = state.settings.model_copy(update={"max_job_steps": 20})
    resp = _adapt(client, model_id, _archive(), {"method": "tent", "epochs": 30, "batch_size": 2})
    expect_error(resp, 422, "invalid_input", "T3AR_API_MAX_JOB_STEPS")
    assert _adapt(client, model_id, _archive(), {"method": "tent", "epochs": 5, "batch_size": 2}).status_code == 202
    # the second stage's steps count too: a short first stage cannot carry an unbounded second one
    resp = _adapt(client, model_id, _archive(), {"method": "t3ar", "k": 1, "epochs": 1, "batch_size": 2,
                                                 "second_stage_steps": 1_000_000})
    err = expect_error(resp, 422, "invalid_input", "T3AR_API_MAX_JOB_STEPS")
    assert "second_stage_steps=1000000" in err["message"], err
    assert _adapt(client, model_id, _archive(), {"method": "t3ar", "k": 1, "epochs": 1, "batch_size": 2,
                                                 "second_stage_steps": 10}).status_code == 202
    state.settings = state.settings.model_copy(update={"max_job_memory_bytes": 10_000_000})
    resp = _adapt(client, model_id, _archive(), {"method": "t3ar", "k": 1, "epochs": 1, "bank_size": 100_000})
    expect_error(resp, 422, "invalid_input", "T3AR_API_MAX_JOB_MEMORY_BYTES")
    assert _adapt(client, model_id, _archive(), {"method": "t3ar", "k": 1, "epochs": 1,
                                                 "bank_size": 1000}).status_code == 202


def test_f5_the_worker_checks_memory_before_it_adapts() -> None:
    import pytest

    from t3ar.method.config import adapt_config
    from t3ar_services.worker.memory import JobTooLargeError, check_job_memory

    cfg = adapt_config(method="t3ar", k=5, bank_size=262_144)
    need = check_job_memory(cfg, 1000, 96, 256, 10, "cpu", available=10**12)
    assert need > 262_144 * 266 * 4
    with pytest.raises(JobTooLargeError, match="bank_size=262144.*lower bank_size or k"):
        check_job_memory(cfg, 1000, 96, 256, 10, "cpu", available=need - 1)


def test_the_worker_token_alone_opens_no_job(env: Any, tmp_path: Path) -> None:  # noqa: F811
    """Issue 29's scope note: a job's worker routes need the job's own secret (in its payload only), so a leaked
    worker token can neither read another job's inputs nor replace its checkpoint or result."""
    from test_api_worker_routes import adapted

    client, redis, data = env
    job_id, spec = _started(client, redis, tmp_path)
    other_id, other = _started(client, redis, tmp_path)
    ckpt, sha, lineage = adapted(data, tmp_path, job_id, spec)
    routes = (("GET", f"/internal/jobs/{job_id}/target", {}), ("GET", f"/internal/jobs/{job_id}/base-model", {}),
              ("PUT", f"/internal/jobs/{job_id}/checkpoint", {"params": {"sha256": sha}, "content": ckpt}),
              ("PUT", f"/internal/jobs/{job_id}/result", {"json": {"report": {"job_id": job_id}, "lineage": lineage}}))
    for headers in (WORKER, {**WORKER, "X-T3AR-Job-Secret": "x" * 43}, as_worker(other)):
        for method, path, kwargs in routes:
            resp = client.request(method, path, headers=headers, **kwargs)  # type: ignore[arg-type]
            expect_error(resp, 403, "forbidden", "X-T3AR-Job-Secret")
    assert not (data / "artifacts" / job_id / "model.pt").exists()
    assert client.get(f"/internal/jobs/{job_id}/target", headers=as_worker(spec)).status_code == 200
    assert client.put(f"/internal/jobs/{job_id}/checkpoint", params={"sha256": sha}, content=ckpt,
                      headers=as_worker(spec)).status_code == 200
    assert other_id != job_id and len(spec["job_secret"]) >= 32 and spec["job_secret"] != other["job_secret"]

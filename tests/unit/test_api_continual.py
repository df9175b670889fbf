"""Contributions and compaction in the API, in-process (TestClient, fakeredis, a mocked retriever): the option
on POST /adapt, the contribution's life (requested -> pending -> done; none for a failed job), a retry that adds
nothing twice, withdrawal as a unit, and every bad request a clear 4xx that changes nothing."""

from __future__ import annotations

import io
import json
import re
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
from PIL import Image
from retriever_answers import item_json, stats_json
from rq.job import Job

from t3ar.clients.retriever import RetrieverClient
from t3ar.models.backbones import BackboneSpec
from t3ar.models.checkpoint import save_checkpoint
from t3ar.models.classifier import ModelSpec, build_classifier
from t3ar_services.api.main import create_app
from t3ar_services.api.settings import ApiSettings
from t3ar_services.common import withdrawn
from t3ar_services.common.job_contract import SERIALIZER, write_json_atomic

USER, ADMIN = {"Authorization": "Bearer user-t"}, {"Authorization": "Bearer admin-t"}


class FakePool:
    """What the API asks of the retriever, over httpx.MockTransport: adds (sha256 once), list by source, bulk
    delete, near-duplicates, item lookups."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {"p-1": {"id": "p-1", "source": "clipart", "sha": "x"}}
        self.seq = 1
        self.adds = 0

    def handle(self, req: httpx.Request) -> httpx.Response:
        path = req.url.path
        if path == "/stats":
            return httpx.Response(200, json=stats_json(len(self.items)))
        if path == "/pool" and req.method == "POST":
            self.adds += 1
            body = req.content
            source = body.split(b'name="source"\r\n\r\n')[1].split(b"\r\n")[0].decode()
            out, added = [], 0
            for name in re.findall(rb'name="files"; filename="([^"]+)"', body):
                key = name.decode()  # the file name stands for its sha256 here
                hit = next((it for it in self.items.values() if it["sha"] == key), None)
                if hit:
                    out.append({"name": key, "status": "exists", "id": hit["id"]})
                    continue
                self.seq += 1
                self.items[f"p-{self.seq}"] = {"id": f"p-{self.seq}", "source": source, "sha": key}
                out.append({"name": key, "status": "added", "id": f"p-{self.seq}"})
                added += 1
            return httpx.Response(200, json={"items": out, "added": added, "exists": len(out) - added,
                                             "duplicates": 0, "rejected": 0})
        if path == "/pool" and req.method == "GET":
            src = req.url.params.get("source")
            items = [item_json(it["id"], it["source"]) for it in self.items.values()
                     if src is None or it["source"] == src]
            return httpx.Response(200, json={"items": items, "next_after": None, "total": len(items)})
        if path == "/pool/delete":
            ids = json.loads(req.content)["ids"]
            gone = [i for i in ids if self.items.pop(i, None) is not None]
            return httpx.Response(200, json={"deleted": gone, "not_found": [i for i in ids if i not in gone]})
        return httpx.Response(404, json={"error": {"code": "not_found", "message": "?"}})


def _png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture()
def env(tmp_path: Path) -> Iterator[tuple[TestClient, Any, FakePool, Any]]:
    settings = ApiSettings(data_dir=tmp_path / "data", token="user-t", admin_token="admin-t",  # type: ignore[arg-type]
                           retriever_admin_token="r-admin", validate_threads=0, sweep_interval=3600)
    redis = fakeredis.FakeRedis()
    pool = FakePool()
    app = create_app(settings, redis=redis)
    state = app.state.api
    for name in ("retriever", "retriever_admin"):  # the contributor looks them up here
        setattr(state, name, RetrieverClient("http://r", "r", transport=httpx.MockTransport(pool.handle), retries=0))
    with TestClient(app) as client:
        yield client, redis, pool, state


def _submit(client: TestClient, tmp_path: Path, **form: str) -> str:
    spec = ModelSpec(backbone=BackboneSpec(name="mobilenetv2_050", weights="none"), classes=("a", "b"), image_size=32)
    save_checkpoint(tmp_path / "m.pt", build_classifier(spec), spec)
    model_id = client.post("/models", files={"file": ("m.pt", (tmp_path / "m.pt").read_bytes())},
                           headers=USER).json()["id"]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for i in range(3):
            zf.writestr(f"i{i}.png", _png(i))
    resp = client.post("/adapt", files={"archive": ("t.zip", buf.getvalue())},
                       data={"model_id": model_id, "config": json.dumps({"method": "tent"}), **form}, headers=USER)
    assert resp.status_code == 202, resp.text
    return str(resp.json()["id"])


def _finish(redis: Any, state: Any, job_id: str) -> None:
    """What a worker leaves behind when a job finishes."""
    out = state.settings.data_dir / "artifacts" / job_id
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "report.json", {"job_id": job_id, "accuracy": None})
    write_json_atomic(out / "lineage.json", {"pool_ids": [], "created_at": "now"})
    Job.fetch(job_id, connection=redis, serializer=SERIALIZER).set_status("finished")


def test_contribution_life_retry_and_withdrawal(env: Any, tmp_path: Path) -> None:
    client, redis, pool, state = env
    job_id = _submit(client, tmp_path, contribute="true")
    view = client.get(f"/jobs/{job_id}", headers=USER).json()
    assert view["contribution"] == {**view["contribution"], "requested": True, "status": "waiting"}
    expect_error(client.delete(f"/jobs/{job_id}/contribution", headers=ADMIN), 409, "conflict", "once it finishes")
    assert state.contributor.run_pending() == 0 and pool.adds == 0  # not finished: nothing contributed

    _finish(redis, state, job_id)
    assert state.contributor.run_pending() == 1
    c = client.get(f"/jobs/{job_id}", headers=USER).json()["contribution"]
    assert (c["status"], c["source"], c["images"], c["added"], c["skipped_exact"]) == \
        ("done", f"target:{job_id}", 3, 3, 0)
    assert client.get(f"/jobs/{job_id}/report", headers=USER).json()["contribution"]["added"] == 3

    state.contributor.records.set_status(job_id, "pending")  # a retry (say, a crash before "done" was recorded)
    assert state.contributor.run_pending() == 1
    c2 = client.get(f"/jobs/{job_id}", headers=USER).json()["contribution"]
    assert (c2["added"], c2["skipped_exact"]) == (3, 0) and len(pool.items) == 4  # nothing added twice

    expect_error(client.delete(f"/jobs/{job_id}/contribution", headers=USER), 403, "forbidden")
    out = client.delete(f"/jobs/{job_id}/contribution", headers=ADMIN).json()
    assert len(out["withdrawn"]) == 3 and set(pool.items) == {"p-1"}
    assert set(withdrawn.read(redis, 0).ids) == set(out["withdrawn"])  # the workers' caches are told
    assert state.contributor.records.withdrawal_reasons(out["withdrawn"]) == {
        i: f"contribution:{job_id}" for i in out["withdrawn"]}
    expect_error(client.delete(f"/jobs/{job_id}/contribution", headers=ADMIN), 404, "not_found", "already withdrawn")
    assert client.get(f"/jobs/{job_id}", headers=USER).json()["contribution"]["status"] == "withdrawn"


def test_a_sweep_during_the_submission_keeps_the_request(env: Any, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's record and its contribution request exist a moment before its queue record: a background sweep
    in that window must not take the job for failed and end the request with "nothing was contributed" (CI saw
    this once: the job then finished and never contributed)."""
    client, redis, pool, state = env
    seen: list[str] = []
    enqueue = state.jobs.enqueue

    def sweep_first(row: Any, *args: Any, **kwargs: Any) -> None:
        state.contributor.run_pending()  # the sweep thread, between the request and the enqueue
        seen.append(client.get(f"/jobs/{row.id}", headers=USER).json()["status"])
        enqueue(row, *args, **kwargs)

    monkeypatch.setattr(state.jobs, "enqueue", sweep_first)
    job_id = _submit(client, tmp_path, contribute="true")
    assert seen == ["queued"]
    assert client.get(f"/jobs/{job_id}", headers=USER).json()["contribution"]["status"] == "waiting"
    _finish(redis, state, job_id)
    assert state.contributor.run_pending() == 1
    assert client.get(f"/jobs/{job_id}", headers=USER).json()["contribution"]["status"] == "done"


def test_failed_job_contributes_nothing_and_bad_requests_are_4xx(env: Any, tmp_path: Path) -> None:
    client, redis, pool, state = env
    job_id = _submit(client, tmp_path, contribute="true")
    plain = _submit(client, tmp_path)
    Job.fetch(job_id, connection=redis, serializer=SERIALIZER).set_status("failed")
    state.contributor.run_pending()
    assert client.get(f"/jobs/{job_id}", headers=USER).json()["contribution"]["status"] == "none"
    assert pool.adds == 0
    expect_error(client.delete(f"/jobs/{job_id}/contribution", headers=ADMIN), 409, "conflict", "contributed nothing")
    expect_error(client.delete(f"/jobs/{plain}/contribution", headers=ADMIN), 409, "conflict", "not submitted")
    expect_error(client.delete("/jobs/nope/contribution", headers=ADMIN), 404, "not_found", "no job")
    assert client.get(f"/jobs/{plain}", headers=USER).json()["contribution"] == {
        **client.get(f"/jobs/{plain}", headers=USER).json()["contribution"], "requested": False,
        "status": "not_requested"}

    for body, fragment in [({"threshold": 0, "sources": ["a"]}, "threshold"),
                           ({"threshold": 1.5, "sources": ["a"]}, "threshold"),
                           ({"threshold": 0.9}, "sources"), ({"sources": ["a"]}, "threshold"),
                           ({"threshold": 0.9, "sources": []}, "sources"),
                           ({"threshold": 0.9, "sources": ["a"], "plan_id": "x"}, "dry_run=false"),
                           ({"dry_run": False}, "plan_id"),
                           ({"dry_run": False, "plan_id": "x", "threshold": 0.9}, "only plan_id"),
                           ({"threshold": 0.9, "sources": ["a"], "sourcez": 1}, "sourcez")]:
        resp = client.post("/pool/compact", json=body, headers=ADMIN)
        assert resp.status_code == 422 and fragment in resp.text, (body, resp.text)
    expect_error(client.post("/pool/compact", json={"dry_run": False, "plan_id": "x"}, headers=ADMIN), 404,
                 "not_found", "no compaction plan")
    expect_error(client.post("/pool/compact", json={"threshold": 0.9, "sources": ["a"]}, headers=USER), 403,
                 "forbidden")
    expect_error(client.post("/adapt", data={"model_id": "m", "contribute": "maybe"},
                             files={"archive": ("t.zip", b"x")}, headers=USER), 422, "invalid_request")


def test_a_withdrawal_lists_only_what_it_withdrew(env: Any, tmp_path: Path) -> None:
    """Issue 34: items of the contribution that compaction (or a single delete) had removed before are not
    listed as withdrawn by the contribution's withdrawal."""
    client, redis, pool, state = env
    job_id = _submit(client, tmp_path, contribute="true")
    _finish(redis, state, job_id)
    assert state.contributor.run_pending() == 1
    mine = sorted(i for i, it in pool.items.items() if it["source"] == f"target:{job_id}")
    assert len(mine) == 3
    del pool.items[mine[0]]  # removed earlier, as compaction removes a near-duplicate
    out = client.delete(f"/jobs/{job_id}/contribution", headers=ADMIN).json()
    assert sorted(out["withdrawn"]) == mine[1:], out
    assert set(pool.items) == {"p-1"}

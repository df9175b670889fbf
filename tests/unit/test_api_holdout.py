"""POST /adapt with an acceptance holdout, in-process (TestClient, fakeredis, a mocked retriever): the job carries
the holdout's digest and options, the worker route serves it, a readapt keeps it, and each bad holdout is a 4xx
that leaves nothing behind."""

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
from fastapi.testclient import TestClient
from PIL import Image
from retriever_answers import stats_json
from rq import Queue
from rq.job import Job

from t3ar.clients.retriever import RetrieverClient
from t3ar.models.backbones import BackboneSpec
from t3ar.models.checkpoint import save_checkpoint
from t3ar.models.classifier import ModelSpec, build_classifier
from t3ar_services.api.main import create_app
from t3ar_services.api.settings import ApiSettings
from t3ar_services.common.job_contract import SERIALIZER

USER = {"Authorization": "Bearer user-t"}
WORKER = {"Authorization": "Bearer worker-t"}


POOLED: dict[str, str] = {}  # sha256 -> pool id: what the mocked pool holds


def _stats() -> httpx.MockTransport:
    def handle(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/stats":
            return httpx.Response(200, json=stats_json(50))
        if req.url.path == "/pool/exists":
            asked = json.loads(req.content)["sha256"]
            return httpx.Response(200, json={"found": {h: POOLED[h] for h in asked if h in POOLED}})
        return httpx.Response(404, json={})

    return httpx.MockTransport(handle)


@pytest.fixture()
def env(tmp_path: Path) -> Iterator[tuple[TestClient, Any, Path, str]]:
    settings = ApiSettings(data_dir=tmp_path / "data", token="user-t", admin_token="admin-t",  # type: ignore[arg-type]
                           worker_token="worker-t", validate_threads=0, max_upload_bytes=200_000,
                           max_holdout_images=4, sweep_interval=3600)
    redis = fakeredis.FakeRedis()
    app = create_app(settings, redis=redis)
    app.state.api.retriever = RetrieverClient("http://r", "r", transport=_stats(), retries=0)
    with TestClient(app) as client:
        spec = ModelSpec(backbone=BackboneSpec(name="mobilenetv2_050", weights="none"), classes=("a", "b"),
                         image_size=32)
        save_checkpoint(tmp_path / "m.pt", build_classifier(spec), spec)
        model = client.post("/models", files={"file": ("m.pt", (tmp_path / "m.pt").read_bytes())}, headers=USER)
        yield client, redis, settings.data_dir, str(model.json()["id"])


def _png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _reencoded(data: bytes, fmt: str = "PNG") -> bytes:
    """The same pixels in other bytes."""
    buf = io.BytesIO()
    Image.open(io.BytesIO(data)).save(buf, fmt, **({"compress_level": 1} if fmt == "PNG" else {}))
    assert buf.getvalue() != data
    return buf.getvalue()


def _zip(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _tgz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


TARGET = _zip({f"i{i}.png": _png(i) for i in range(4)})
HOLDOUT = _zip({"a/h1.png": _png(101), "b/h2.png": _png(102)})


def _adapt(client: TestClient, model_id: str, holdout: bytes | None, **form: Any) -> httpx.Response:
    files = {"archive": ("t.zip", TARGET)}
    if holdout is not None:
        files["holdout"] = ("h.zip", holdout)
    return client.post("/adapt", files=files, headers=USER,
                       data={"model_id": model_id, "config": json.dumps({"method": "tent", "epochs": 1}), **form})


def test_a_holdout_travels_with_the_job(env: Any) -> None:
    client, redis, data, model_id = env
    resp = _adapt(client, model_id, HOLDOUT, candidates="source,tent", require_gain="true", winner_rule="argmax")
    assert resp.status_code == 202, resp.text
    job_id = resp.json()["id"]
    spec = Job.fetch(job_id, connection=redis, serializer=SERIALIZER).args[0]
    assert spec["acceptance"] == {"candidates": ["source", "tent"], "require_gain": True, "rule": "argmax"}
    got = client.get(f"/internal/jobs/{job_id}/holdout", headers={**WORKER, "X-T3AR-Job-Secret": spec["job_secret"]})
    assert got.status_code == 200 and hashlib.sha256(got.content).hexdigest() == spec["holdout_sha256"]
    assert len(got.content) == spec["holdout_bytes"]
    with tarfile.open(fileobj=io.BytesIO(got.content)) as tf:
        assert sorted(tf.getnames()) == ["a/h1.png", "b/h2.png"]
    # the target tar holds no holdout image (the holdout is never trained on)
    with tarfile.open(data / "jobs" / job_id / "target.tar") as tf:
        assert sorted(tf.getnames()) == [f"i{i}.png" for i in range(4)]
    again = client.post(f"/jobs/{job_id}/readapt", headers=USER)
    assert again.status_code == 202, again.text
    respec = Job.fetch(again.json()["id"], connection=redis, serializer=SERIALIZER).args[0]
    assert respec["acceptance"] == spec["acceptance"] and respec["holdout_sha256"] == spec["holdout_sha256"]


def test_a_job_without_holdout_has_none(env: Any) -> None:
    client, redis, _, model_id = env
    resp = _adapt(client, model_id, None)
    assert resp.status_code == 202, resp.text
    spec = Job.fetch(resp.json()["id"], connection=redis, serializer=SERIALIZER).args[0]
    assert spec["acceptance"] is None and spec["holdout_sha256"] is None
    got = client.get(f"/internal/jobs/{resp.json()['id']}/holdout",
                     headers={**WORKER, "X-T3AR-Job-Secret": spec["job_secret"]})
    assert got.status_code == 404


@pytest.mark.parametrize(("holdout", "form", "status", "message"), [
    (_zip({"a/h1.png": _png(101), "zebra/h2.png": _png(102)}), {}, 422, "zebra"),
    (_zip({"a/h1.png": _png(101), "b/.keep": b""}), {}, 422, "b have no image"),
    (_zip({"a/h1.png": _png(101), "b/copy.png": _png(2)}), {}, 422, "also in the target"),
    # N7 (issue 50): a target image re-encoded (other bytes, the same pixels) is found by its pixel digest
    (_zip({"a/h1.png": _png(101), "b/copy.png": _reencoded(_png(2))}), {}, 422, "also in the target"),
    (_zip({"a/h1.png": _png(101), "b/copy.bmp": _reencoded(_png(2), "BMP")}), {}, 422, "also in the target"),
    (_zip({f"a/h{i}.png": _png(100 + i) for i in range(5)}), {}, 422, "T3AR_API_MAX_HOLDOUT_IMAGES"),
    # N4 (issue 50): counted from the archive's headers, before one image is decoded (these would not decode)
    (_zip({f"a/h{i}.png": b"not a png" for i in range(5)}), {}, 422, "5 images, more than the 4 allowed"),
    (_tgz({f"a/h{i}.png": b"not a png" for i in range(5)}), {}, 422, "5 images, more than the 4 allowed"),
    (_zip({"h1.png": _png(101)}), {}, 422, "holdout"),
    (b"not an archive", {}, 422, "holdout is not a zip"),
    (_zip({"a/h1.png": b"not a png", "b/h2.png": _png(102)}), {}, 422, "h1.png"),
    (HOLDOUT, {"candidates": "tent,magic"}, 422, "unknown candidate"),
    (HOLDOUT, {"winner_rule": "best"}, 422, "rule"),
    (None, {"require_gain": "true"}, 422, "send a holdout part"),
    (None, {"candidates": "tent"}, 422, "send a holdout part"),
])
def test_bad_holdouts_are_refused_and_leave_nothing(env: Any, holdout: bytes | None, form: dict[str, str],
                                                    status: int, message: str) -> None:
    client, redis, data, model_id = env
    resp = _adapt(client, model_id, holdout, **form)
    assert resp.status_code == status, resp.text
    assert message in resp.json()["error"]["message"], resp.json()
    assert "/jobs/" not in resp.json()["error"]["message"]  # no server path
    assert Queue("t3ar-adapt", connection=redis, serializer=SERIALIZER).count == 0
    assert list((data / "jobs").iterdir()) == []


def test_the_acceptance_record_shows_in_get_job(env: Any) -> None:
    from t3ar.acceptance import as_record, decide

    client, redis, _, model_id = env
    job_id = _adapt(client, model_id, HOLDOUT).json()["id"]
    assert client.get(f"/jobs/{job_id}", headers=USER).json()["acceptance"] is None
    record = as_record(decide({"source": [True, False], "bn-adapt": [True, True], "tent": [False, True]},
                              "paired")).model_dump(mode="json")
    job = Job.fetch(job_id, connection=redis, serializer=SERIALIZER)
    job.meta.update(acceptance=record, phase="candidate", candidate="tent (3/3)")
    job.save_meta()
    got = client.get(f"/jobs/{job_id}", headers=USER).json()
    assert got["acceptance"]["winner"] == "source" and got["progress"]["candidate"] == "tent (3/3)"
    assert [c["name"] for c in got["acceptance"]["candidates"]] == ["source", "bn-adapt", "tent"]
    job.meta["acceptance"] = {"winner": "source"}  # what does not fit the contract is left out, never a 500
    job.save_meta()
    resp = client.get(f"/jobs/{job_id}", headers=USER)
    assert resp.status_code == 200 and resp.json()["acceptance"] is None


def test_a_holdout_image_in_the_pool_is_refused_for_retrieval_candidates(env: Any) -> None:
    client, redis, data, model_id = env
    POOLED[hashlib.sha256(_png(102)).hexdigest()] = "e2e/000042"
    try:
        files = {"archive": ("t.zip", TARGET), "holdout": ("h.zip", HOLDOUT)}
        resp = client.post("/adapt", files=files, headers=USER, data={
            "model_id": model_id, "config": json.dumps({"method": "t3ar", "k": 2, "epochs": 1})})
        assert resp.status_code == 422, resp.text
        message = resp.json()["error"]["message"]
        assert "already in the pool" in message and "e2e/000042" in message
        assert list((data / "jobs").iterdir()) == []
        # no candidate retrieves: the pool is never asked, and the job goes ahead
        assert _adapt(client, model_id, HOLDOUT).status_code == 202
    finally:
        POOLED.clear()

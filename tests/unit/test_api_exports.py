"""``GET /jobs/{id}/checkpoint?format=onnx|safetensors`` and the console's downloads (issue 35), in-process (fakeredis,
a job finished the way a worker finishes it): the formats, made once under concurrent first requests, sha256
recorded in the job, a failed export leaves nothing, a bad format is a 4xx, the checkpoint route's auth."""

from __future__ import annotations

import hashlib
import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from console_kit import console_client, finished_job, new_pool, signed_in
from fastapi.testclient import TestClient

from t3ar.models.checkpoint import load_checkpoint
from t3ar_services.common.job_contract import MODEL_FILE, artifacts_dir

ort = pytest.importorskip("onnxruntime", reason="the export extra: bash scripts/setup.sh")
USER = {"Authorization": "Bearer user-t"}


@pytest.fixture()
def client(tmp_path: Path) -> Iterator[TestClient]:
    yield from console_client(tmp_path, new_pool())


@pytest.fixture()
def job_id(client: TestClient, tmp_path: Path) -> str:
    return finished_job(client, tmp_path, signed_in(client, "user-t"))


def _get(client: TestClient, job_id: str, fmt: str | None = None, **kw: Any) -> Any:
    return client.get(f"/jobs/{job_id}/checkpoint", params={"format": fmt} if fmt else None,
                      headers=kw.pop("headers", USER), **kw)


@pytest.mark.slow  # two real exports and their parity runs: ~20 s on the busy 2-core machine
def test_the_three_formats_download_and_each_export_is_recorded_in_the_job(client: TestClient, job_id: str,
                                                                           tmp_path: Path) -> None:
    art = artifacts_dir(tmp_path / "data", job_id)
    pt = _get(client, job_id)
    assert pt.status_code == 200 and pt.content == (art / MODEL_FILE).read_bytes()
    assert client.get(f"/jobs/{job_id}", headers=USER).json()["exports"] == {}  # nothing made before it is asked
    onnx = _get(client, job_id, "onnx")
    assert onnx.status_code == 200, onnx.text
    assert onnx.headers["content-type"] == "application/octet-stream"
    assert f't3ar-{job_id}.onnx' in onnx.headers["content-disposition"]
    assert onnx.headers["x-checksum-sha256"] == hashlib.sha256(onnx.content).hexdigest()
    assert (art / "model.onnx").read_bytes() == onnx.content  # kept beside the checkpoint
    session = ort.InferenceSession(onnx.content, providers=["CPUExecutionProvider"])
    assert json.loads(session.get_modelmeta().custom_metadata_map["t3ar.classes"]) == ["a", "b"]
    st = _get(client, job_id, "safetensors")
    assert st.status_code == 200
    path = tmp_path / "back.safetensors"
    path.write_bytes(st.content)
    a, _ = load_checkpoint(art / MODEL_FILE)
    b, _ = load_checkpoint(path)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    exports = client.get(f"/jobs/{job_id}", headers=USER).json()["exports"]
    assert set(exports) == {"onnx", "safetensors"}
    assert exports["onnx"]["sha256"] == hashlib.sha256(onnx.content).hexdigest() and exports["onnx"]["size"] == \
        len(onnx.content)
    assert exports["safetensors"]["sha256"] == hashlib.sha256(st.content).hexdigest()
    parity = exports["onnx"]["parity"]
    # the job's own 4 target images (16 px PNGs, read at the model's 32 px), topped up with generated ones
    assert parity["ok"] and parity["images"] == 64 and parity["top1_agreement"] == 1.0
    assert parity["images_source"] == "4 images of the job's target + 60 generated (seed 0)"
    assert exports["onnx"]["url"].endswith(f"/jobs/{job_id}/checkpoint?format=onnx")
    again = _get(client, job_id, "onnx")  # served from the kept file
    assert again.content == onnx.content


def test_a_safetensors_file_is_accepted_as_a_base_model(client: TestClient, tmp_path: Path) -> None:
    """What `t3ar export --format safetensors` writes uploads like a checkpoint (the loader tells them apart)."""
    from console_kit import model_file

    from t3ar.models.checkpoint import read_payload
    from t3ar.models.safetensors_io import to_safetensors

    model_file(tmp_path)
    payload, sha = read_payload(tmp_path / "m.pt")
    data = to_safetensors(payload, source_sha256=sha)
    resp = client.post("/models", files={"file": ("m.safetensors", data)}, headers=USER)
    assert resp.status_code == 201, resp.text
    assert resp.json()["classes"] == ["a", "b"] and resp.json()["sha256"] == hashlib.sha256(data).hexdigest()


def test_concurrent_first_requests_make_the_export_once(client: TestClient, job_id: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import t3ar.export

    made: list[str] = []
    real = t3ar.export.export_checkpoint

    def counted(*args: Any, **kwargs: Any) -> Any:
        made.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(t3ar.export, "export_checkpoint", counted)  # a spy: the real export still runs
    bodies: list[bytes] = []
    errors: list[BaseException] = []

    def fetch() -> None:
        try:
            resp = _get(client, job_id, "safetensors")
            assert resp.status_code == 200, resp.text
            bodies.append(resp.content)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=fetch) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(bodies) == 4 and len(set(bodies)) == 1
    assert len(made) == 1, made


def test_a_failed_export_leaves_nothing_and_says_why(client: TestClient, job_id: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from t3ar.export import exporter

    art = artifacts_dir(tmp_path / "data", job_id)
    before = sorted(p.name for p in art.iterdir())
    real = exporter.onnx_logits
    monkeypatch.setattr(exporter, "onnx_logits", lambda data, images: real(data, images) + 0.01)
    resp = _get(client, job_id, "onnx")
    assert resp.status_code == 422 and resp.json()["error"]["code"] == "export_failed"
    assert "max |logit diff| 1.00e-02" in resp.json()["error"]["message"]
    assert sorted(p.name for p in art.iterdir()) == before  # no file, no temp file
    assert client.get(f"/jobs/{job_id}", headers=USER).json()["exports"] == {}
    monkeypatch.setattr(exporter, "onnx_logits", real)
    assert _get(client, job_id, "onnx").status_code == 200  # nothing half-made stood in the way


def test_bad_formats_unfinished_jobs_and_auth_as_the_checkpoint_route(client: TestClient, job_id: str) -> None:
    bad = _get(client, job_id, "tflite")
    assert bad.status_code == 422 and "format" in json.dumps(bad.json())
    for fmt in (None, "onnx"):
        assert _get(client, job_id, fmt, headers={}).status_code == 401
        assert _get(client, job_id, fmt, headers={"Authorization": "Bearer nope"}).status_code == 401
        assert _get(client, "no-such-job", fmt).status_code == 404
    model_id = client.get("/models", headers=USER).json()["models"][0]["id"]
    buf = io.BytesIO()
    import zipfile

    from console_kit import png_image

    with zipfile.ZipFile(buf, "w") as zf:
        for i in range(2):
            zf.writestr(f"x{i}.png", png_image(i))
    queued = client.post("/adapt", files={"archive": ("t.zip", buf.getvalue())},
                         data={"model_id": model_id, "config": json.dumps({"method": "tent", "epochs": 1})},
                         headers=USER).json()["id"]
    for fmt in (None, "onnx", "safetensors"):
        resp = _get(client, queued, fmt)
        assert resp.status_code == 409 and "not finished" in resp.json()["error"]["message"]


def test_the_console_job_page_offers_the_three_downloads(client: TestClient, job_id: str) -> None:
    page = client.get(f"/ui/jobs/{job_id}")
    for anchor in ("download-checkpoint", "download-onnx", "download-safetensors"):
        assert f'id="{anchor}"' in page.text
    assert 'id="exports"' not in page.text
    onnx = client.get(f"/ui/jobs/{job_id}/checkpoint?format=onnx")
    assert onnx.status_code == 200 and onnx.content == _get(client, job_id, "onnx").content  # the same file
    assert client.get(f"/ui/jobs/{job_id}/checkpoint?format=safetensors").status_code == 200
    pt = client.get(f"/ui/jobs/{job_id}/checkpoint")
    assert pt.status_code == 200 and pt.content == _get(client, job_id).content
    bad = client.get(f"/ui/jobs/{job_id}/checkpoint?format=tflite")
    assert bad.status_code == 422 and "unknown checkpoint format" in bad.text and "<html" in bad.text.lower()
    page = client.get(f"/ui/jobs/{job_id}")
    assert 'id="exports"' in page.text and hashlib.sha256(onnx.content).hexdigest() in page.text


def _second_job(client: TestClient, tmp_path: Path, first: str) -> str:
    """Another finished job of the same model (its artifacts copied from ``first``'s)."""
    import shutil
    import zipfile

    from console_kit import png_image

    model_id = client.get("/models", headers=USER).json()["models"][0]["id"]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for i in range(3):
            zf.writestr(f"y{i}.png", png_image(10 + i))
    resp = client.post("/adapt", files={"archive": ("t.zip", buf.getvalue())},
                       data={"model_id": model_id, "config": json.dumps({"method": "tent", "epochs": 1})},
                       headers=USER)
    assert resp.status_code == 202, resp.text
    second = str(resp.json()["id"])
    shutil.copytree(artifacts_dir(tmp_path / "data", first), artifacts_dir(tmp_path / "data", second))
    client.app.state.api.jobs.fetch(second).delete()  # type: ignore[attr-defined]  # disk says finished
    return second


@pytest.mark.slow  # two real ONNX exports: ~15 s on the busy 2-core machine
def test_concurrent_first_exports_of_two_jobs_both_succeed_one_torch_export_at_a_time(
        client: TestClient, job_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``torch.onnx.export`` keeps process-global state: two at once failed one of them with export_failed."""
    other = _second_job(client, tmp_path, job_id)
    real = torch.onnx.export
    inside: list[int] = []
    most: list[int] = [0]
    both_in = threading.Barrier(2)

    def watched(*args: Any, **kwargs: Any) -> Any:
        inside.append(1)
        most[0] = max(most[0], len(inside))
        try:
            both_in.wait(timeout=5)  # the other export gets every chance to enter alongside this one
        except threading.BrokenBarrierError:
            pass
        try:
            return real(*args, **kwargs)
        finally:
            inside.pop()

    monkeypatch.setattr(torch.onnx, "export", watched)
    answers: dict[str, Any] = {}

    def fetch(jid: str) -> None:
        answers[jid] = _get(client, jid, "onnx")

    threads = [threading.Thread(target=fetch, args=(j,)) for j in (job_id, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {j: r.status_code for j, r in answers.items()} == {job_id: 200, other: 200}, \
        {j: r.text[:300] for j, r in answers.items()}
    assert most[0] == 1  # never two torch exports at once in the process


def test_an_export_over_the_memory_cap_is_refused_before_it_starts(tmp_path: Path) -> None:
    from console_kit import app_for, settings_for

    import t3ar.export

    with TestClient(app_for(settings_for(tmp_path, max_export_memory_bytes=1024**2), new_pool())) as client:
        job_id = finished_job(client, tmp_path, signed_in(client, "user-t"))
        art = artifacts_dir(tmp_path / "data", job_id)
        before = sorted(p.name for p in art.iterdir())
        started: list[int] = []
        real = t3ar.export.export_checkpoint
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(t3ar.export, "export_checkpoint", lambda *a, **k: started.append(1) or real(*a, **k))
            for fmt in ("onnx", "safetensors"):
                resp = _get(client, job_id, fmt)
                assert resp.status_code == 422, resp.text
                error = resp.json()["error"]
                assert error["code"] == "export_too_large"
                assert "T3AR_API_MAX_EXPORT_MEMORY_BYTES" in error["message"] and "32 px" in error["message"]
        assert started == []  # refused before the export began
        assert sorted(p.name for p in art.iterdir()) == before
        assert client.get(f"/jobs/{job_id}", headers=USER).json()["exports"] == {}
        assert _get(client, job_id).status_code == 200  # the .pt checkpoint still downloads

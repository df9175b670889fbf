"""Shared parts of the console's in-process tests (test_console_session.py, test_console_pages.py): an API app
with fakeredis and a mocked retriever whose pool items carry hostile strings, sign-in helpers, a finished job."""

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
from fastapi.testclient import TestClient
from PIL import Image
from retriever_answers import stats_json

from t3ar.clients.retriever import RetrieverClient
from t3ar.models.backbones import BackboneSpec
from t3ar.models.checkpoint import save_checkpoint
from t3ar.models.classifier import ModelSpec, build_classifier
from t3ar_services.api.main import create_app
from t3ar_services.api.settings import ApiSettings
from t3ar_services.common.job_contract import LINEAGE_FILE, REPORT_FILE, artifacts_dir, write_json_atomic

HOSTILE = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'
JS_URL = "javascript:alert(3)"
SECRET = "console-test-secret-0123456789"


def png_image(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def item_json(pid: str) -> dict[str, Any]:
    return {"id": pid, "sha256": "0" * 64, "source": HOSTILE, "metadata": {"caption": HOSTILE, "url": JS_URL,
                                                                          HOSTILE: "key"},
            "filename": f"{HOSTILE}.png", "media_type": "image/png", "size": 100, "width": 16, "height": 16,
            "added_at": 0.0, "label": LABELS.get(pid)}


#: the class labels of the mocked pool's items (issue 33): one plain, one hostile; others unlabelled
LABELS = {"p-1": "red", "p-2": HOSTILE}


def mock_retriever(pool: dict[str, Any]) -> httpx.MockTransport:
    def handle(req: httpx.Request) -> httpx.Response:
        path = req.url.path
        if path == "/stats":
            return httpx.Response(200, json=stats_json(
                len(pool["ids"]), duplicate_threshold=pool.get("threshold", 0.98),
                sources={HOSTILE: len(pool["ids"])}, labels={LABELS[p]: 1 for p in pool["ids"] if p in LABELS}))
        if path == "/pool" and req.method == "GET":
            pool.setdefault("listed", []).append(dict(req.url.params))
            items = [item_json(p) for p in sorted(pool["ids"])]
            if "source" in req.url.params:
                items = [it for it in items if it["source"] == req.url.params["source"]]
            if "label" in req.url.params:
                items = [it for it in items if it["label"] == req.url.params["label"]]
            return httpx.Response(200, json={"items": items, "next_after": None, "total": len(items)})
        if path == "/pool" and req.method == "POST":  # an add: each file added, unless its name says rejected
            assert req.headers["authorization"] == "Bearer r-rw"
            names = re.findall(rb'name="files"; filename="([^"]*)"', req.read())
            items = []
            for name in (n.decode() for n in names):
                if "bad" in name:
                    items.append({"name": name, "status": "rejected", "id": None, "sha256": None, "duplicate_of": None,
                                  "score": None, "error": {"code": "bad_image", "message": f"{name}: not an image"}})
                    continue
                pid = f"p-{len(pool['ids']) + 1}"
                pool["ids"].add(pid)
                pool.setdefault("added", []).append((pid, name, dict(req.url.params)))
                items.append({"name": name, "status": "added", "id": pid, "sha256": "1" * 64, "duplicate_of": None,
                              "score": None, "error": None})
            counts = {k: sum(it["status"] == v for it in items) for k, v in
                      (("added", "added"), ("exists", "exists"), ("duplicates", "duplicate"),
                       ("rejected", "rejected"))}
            if not counts["added"]:
                return httpx.Response(422, json={"error": {"code": "items_rejected", "message": "nothing added",
                                                           "items": items}})
            return httpx.Response(200, json={"items": items, **counts})
        if path == "/search":
            ids = sorted(pool["ids"])
            return httpx.Response(200, json={"results": [{"ids": ids, "scores": [0.9] * len(ids),
                                                          "labels": [LABELS.get(i) for i in ids]}],
                                             "identity": "fake", "k": len(ids)})
        m = re.fullmatch(r"/pool/([^/]+)(/image)?", path)
        if m:
            pid = m.group(1)
            if pid not in pool["ids"]:
                return httpx.Response(404, json={"error": {"code": "not_found", "message": f"no item {pid}"}})
            if req.method == "DELETE":
                assert req.headers["authorization"] == "Bearer r-admin"
                pool["ids"].remove(pid)
                pool["deleted"].append(pid)
                return httpx.Response(200, json={"deleted": [pid], "not_found": []})
            if m.group(2):
                return httpx.Response(200, content=png_image(1), headers={"content-type": "image/png"})
            return httpx.Response(200, json=item_json(pid))
        return httpx.Response(404, json={"error": {"code": "not_found", "message": "?"}})

    return httpx.MockTransport(handle)


def settings_for(tmp_path: Path, **kw: Any) -> ApiSettings:
    base: dict[str, Any] = dict(data_dir=tmp_path / "data", token="user-t", admin_token="admin-t",
                                worker_token="worker-t", retriever_admin_token="r-admin", validate_threads=0,
                                sweep_interval=3600, session_secret=SECRET)
    return ApiSettings(**{**base, **kw})


def app_for(settings: ApiSettings, pool: dict[str, Any]) -> Any:
    app = create_app(settings, redis=fakeredis.FakeRedis())
    state = app.state.api
    state.retriever = RetrieverClient("http://r", "r-rw", transport=mock_retriever(pool), retries=0)
    state.retriever_admin = RetrieverClient("http://r", "r-admin", transport=mock_retriever(pool), retries=0)
    return app


def new_pool() -> dict[str, Any]:
    """The mocked retriever's state: its ids, and the ids its DELETE was called for."""
    return {"ids": {"p-1", "p-2"}, "deleted": []}


def console_client(tmp_path: Path, pool: dict[str, Any]) -> Iterator[TestClient]:
    """Body of the test modules' ``client`` fixture: the app over ``pool``, running."""
    with TestClient(app_for(settings_for(tmp_path), pool)) as c:
        yield c


@pytest.fixture()
def pool() -> dict[str, Any]:
    """The mocked retriever's state (:func:`new_pool`); import it with :func:`client` as a module's fixtures."""
    return new_pool()


@pytest.fixture()
def client(tmp_path: Path, pool: dict[str, Any]) -> Iterator[TestClient]:
    """The console's app over ``pool``, running."""
    yield from console_client(tmp_path, pool)


def csrf_of(html: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', html)
    assert m, html[:2000]
    return m.group(1)


def sign_in(client: TestClient, token: str) -> httpx.Response:
    page = client.get("/ui/login")
    return client.post("/ui/login", data={"csrf": csrf_of(page.text), "token": token, "next": "/ui/jobs"},
                       follow_redirects=False)


def signed_in(client: TestClient, token: str = "user-t") -> str:
    """Signs in; returns the CSRF token of the session."""
    resp = sign_in(client, token)
    assert resp.status_code == 303 and resp.headers["location"] == "/ui/jobs", resp.text
    return csrf_of(client.get("/ui/jobs").text)


def model_file(tmp_path: Path) -> bytes:
    spec = ModelSpec(backbone=BackboneSpec(name="mobilenetv2_050", weights="none"), classes=("a", "b"), image_size=32)
    save_checkpoint(tmp_path / "m.pt", build_classifier(spec), spec)
    return (tmp_path / "m.pt").read_bytes()


def target_zip() -> bytes:
    """A target archive of four unlabelled images."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for i in range(4):
            zf.writestr(f"imgs/{'ab'[i % 2]}{i}.png", png_image(i))
    return buf.getvalue()


def finished_job(client: TestClient, tmp_path: Path, csrf: str) -> str:
    """A job submitted through the JSON API, finished the way a worker finishes it (artifacts on disk)."""
    model = model_file(tmp_path)
    resp = client.post("/ui/models", files={"file": (f"{HOSTILE}.pt", model)}, data={"name": HOSTILE, "csrf": csrf},
                       follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"].startswith("/ui/models?uploaded=")  # reload-safe
    resp = client.get(resp.headers["location"])
    assert resp.status_code == 200 and 'id="uploaded">Uploaded:' in resp.text, resp.text
    model_id = client.get("/models", headers={"Authorization": "Bearer user-t"}).json()["models"][0]["id"]
    resp = client.post("/adapt", files={"archive": ("t.zip", target_zip())},
                       data={"model_id": model_id, "config": json.dumps({"method": "t3ar", "k": 2, "epochs": 1})},
                       headers={"Authorization": "Bearer user-t"})
    assert resp.status_code == 202, resp.text
    job_id = str(resp.json()["id"])
    art = artifacts_dir(tmp_path / "data", job_id)
    art.mkdir(parents=True)
    report = {"version": 1, "job_id": job_id,
              "epochs": [{"epoch": 0, "loss": 2.0, "loss_ce": 1.0, "loss_contrastive": 1.0, "pl_change_rate": 0.5}],
              "step_history": [{"step": i, "epoch": 0, "loss": 2.0 - i / 10, "loss_ce": 1.0, "loss_contrastive": 1.0,
                                "pl_change_rate": 0.5 - i / 20} for i in range(5)],
              "accuracy": {"before": {"top1": 0.4}, "after": {"top1": 0.6}},
              "neighbour_sample": [{"target": "imgs/a0.png", "neighbours": [{"id": "p-1", "score": 0.91},
                                                                            {"id": "p-2", "score": 0.5}]}],
              "labelled_neighbours": [{"pool_id": "p-1", "label": "red", "uses": 3},
                                      {"pool_id": "p-2", "label": HOSTILE, "uses": 1}],
              "labelled_neighbours_total": 2}
    write_json_atomic(art / REPORT_FILE, report)
    (art / "model.pt").write_bytes(model)
    write_json_atomic(art / LINEAGE_FILE, {"pool_ids": ["p-1", "p-2"], "checkpoint_sha256": "0" * 64})
    client.app.state.api.jobs.fetch(job_id).delete()  # type: ignore[attr-defined]  # rq forgot it: disk says finished
    return job_id

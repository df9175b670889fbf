"""Request bodies on the API: each route reads no more than what it takes, refused (413) before it is read,
declared or chunked; the worker's result is read only after the job's own secret (issue 34, G1 and G6)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from asgi_kit import call
from fastapi.testclient import TestClient
from test_api_routes import ADMIN, USER
from test_api_worker_routes import WORKER, _job, adapted, as_worker
from test_api_worker_routes import env as env  # the fixture

MiB = 1 << 20


def test_a_result_with_a_wrong_secret_is_refused_before_its_body_is_read(env: Any, tmp_path: Path) -> None:
    client, redis, _ = env
    job_id, spec = _job(client, redis, tmp_path)
    wrong = {**WORKER, "X-T3AR-Job-Secret": "not-the-secret"}
    resp = client.put(f"/internal/jobs/{job_id}/result", json={}, headers=wrong)
    assert resp.status_code == 403, resp.text  # not 422: the body is not looked at
    resp = client.put("/internal/jobs/no-such-job/result", json={}, headers=wrong)
    assert resp.status_code == 404, resp.text
    # an endless chunked body: answered without reading it
    answer = call(client.app, "PUT", f"/internal/jobs/{job_id}/result",
                  [("authorization", "Bearer worker-t"), ("x-t3ar-job-secret", "nope"),
                   ("content-type", "application/json"), ("transfer-encoding", "chunked")])
    assert answer.status == 403 and answer.pulled <= MiB, (answer.status, answer.pulled)
    answer = call(client.app, "PUT", "/internal/jobs/none/result",
                  [("authorization", "Bearer worker-t"), ("content-type", "application/json"),
                   ("transfer-encoding", "chunked")])
    assert answer.status == 404 and answer.pulled <= MiB, (answer.status, answer.pulled)


def test_a_result_body_is_bounded(env: Any, tmp_path: Path) -> None:
    client, redis, data = env
    job_id, spec = _job(client, redis, tmp_path)
    limit = client.app.state.api.settings.max_result_bytes
    headers = [("authorization", "Bearer worker-t"), ("x-t3ar-job-secret", spec["job_secret"]),
               ("content-type", "application/json")]
    declared = call(client.app, "PUT", f"/internal/jobs/{job_id}/result",
                    [*headers, ("content-length", str(limit + 1))], total=limit + 1)
    assert declared.status == 413 and declared.pulled == 0, (declared.status, declared.pulled)
    assert "T3AR_API_MAX_RESULT_BYTES" in json.loads(declared.body)["error"]["message"]
    chunked = call(client.app, "PUT", f"/internal/jobs/{job_id}/result", [*headers, ("transfer-encoding", "chunked")])
    assert chunked.status == 413 and chunked.pulled <= limit + MiB, (chunked.status, chunked.pulled)
    assert not (data / "artifacts" / job_id / "result.json").exists()


def test_a_good_result_still_finishes_the_job_and_bad_json_is_4xx(env: Any, tmp_path: Path) -> None:
    client, redis, data = env
    job_id, spec = _job(client, redis, tmp_path)
    W = as_worker(spec)
    ckpt, sha, lineage = adapted(data, tmp_path, job_id, spec)
    assert client.put(f"/internal/jobs/{job_id}/checkpoint", params={"sha256": sha}, content=ckpt,
                      headers=W).status_code == 200
    url = f"/internal/jobs/{job_id}/result"
    bad = client.put(url, content=b"{not json", headers={**W, "content-type": "application/json"})
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_request", bad.text  # as FastAPI's
    missing = client.put(url, json={"report": {}}, headers=W)
    assert missing.status_code == 422 and "lineage" in missing.json()["error"]["message"]
    done = client.put(url, json={"report": {"job_id": job_id}, "lineage": lineage}, headers=W)
    assert done.status_code == 200 and done.json()["stored"] is True, done.text
    schema = client.get("/openapi.json").json()["paths"]["/internal/jobs/{job_id}/result"]["put"]
    assert "lineage" in json.dumps(schema["requestBody"])  # still documented


def test_every_route_has_a_limit_that_fits_what_it_takes(env: Any, tmp_path: Path) -> None:
    """JSON and form routes take a few fields: a body over 1 MiB is refused unread, declared or chunked; the
    upload routes keep their own limits (test_api_routes, test_api_worker_routes)."""
    client, redis, _ = env
    job_id, _ = _job(client, redis, tmp_path)
    for method, path, headers in (("POST", "/pool/compact", ADMIN), ("POST", f"/jobs/{job_id}/cancel", USER),
                                  ("POST", f"/jobs/{job_id}/readapt", USER),
                                  ("DELETE", f"/jobs/{job_id}/contribution", ADMIN),
                                  ("GET", "/jobs", USER),
                                  ("POST", "/ui/login", {}), ("POST", "/ui/logout", {})):
        hs = [*headers.items(), ("content-type", "application/json")]
        declared = call(client.app, method, path, [*hs, ("content-length", str(2 * MiB))], total=2 * MiB)
        assert declared.status == 413 and declared.pulled == 0, (method, path, declared.status, declared.pulled)
        chunked = call(client.app, method, path, [*hs, ("transfer-encoding", "chunked")], chunk=64 * 1024)
        # read no further than the limit (413), or not at all (a route that takes no body answers without it)
        assert chunked.pulled <= 128 * 1024 and chunked.status < 500, (method, path, chunked.status, chunked.pulled)
    # the upload routes still take big bodies (up to their settings)
    big = call(client.app, "POST", "/models", [*USER.items(), ("content-type", "multipart/form-data; boundary=x"),
                                               ("content-length", str(5 * MiB))], total=5 * MiB)
    assert big.status == 400 and big.pulled > 64 * 1024, (big.status, big.pulled)  # read: zeros are no multipart


def test_the_client_fixture_is_usable(env: Any) -> None:
    client: TestClient = env[0]
    assert client.get("/health").status_code == 200

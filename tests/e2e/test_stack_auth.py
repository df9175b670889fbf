"""Auth matrix of the API: open ops routes; user token for adapt/read; admin token for pool deletes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from stack_helpers import ROOT, Stack, inherited_path

USER_ROUTES = [
    ("GET", "/models"), ("POST", "/models"), ("GET", "/models/none"), ("GET", "/jobs"), ("GET", "/jobs/none"),
    ("POST", "/adapt"), ("POST", "/jobs/none/cancel"), ("GET", "/jobs/none/checkpoint"),
    ("GET", "/jobs/none/report"), ("POST", "/jobs/none/readapt"), ("GET", "/pool/none-1/lineage"),
]
ADMIN_ROUTES = [("DELETE", "/pool/none-1")]
WORKER_ROUTES = [("GET", "/internal/ping"), ("GET", "/internal/jobs/none/target"),
                 ("GET", "/internal/jobs/none/base-model"),
                 ("PUT", f"/internal/jobs/none/checkpoint?sha256={'0' * 64}"), ("PUT", "/internal/jobs/none/result")]
OPEN_ROUTES = [("GET", "/health"), ("GET", "/ready"), ("GET", "/metrics")]


def _call(stack: Stack, method: str, path: str, token: str | None) -> httpx.Response:
    headers = {"Authorization": token if " " in (token or "") else f"Bearer {token}"} if token is not None else {}
    return httpx.request(method, stack.info["api_url"] + path, headers=headers, timeout=30)


@pytest.mark.parametrize(("method", "path"), OPEN_ROUTES)
def test_open_routes(stack: Stack, method: str, path: str) -> None:
    assert _call(stack, method, path, None).status_code == 200


@pytest.mark.parametrize(("method", "path"), USER_ROUTES + ADMIN_ROUTES + WORKER_ROUTES)
def test_no_or_wrong_token_is_401(stack: Stack, method: str, path: str) -> None:
    for token in (None, "wrong-token", f"Basic {stack.info['tokens']['api_admin_token']}"):
        resp = _call(stack, method, path, token)
        assert resp.status_code == 401, (token, resp.text)
        assert resp.json()["error"]["code"] == "unauthorized"
        assert resp.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(("method", "path"), USER_ROUTES)
def test_user_and_admin_tokens_pass_user_routes(stack: Stack, method: str, path: str) -> None:
    for token in (stack.info["tokens"]["api_token"], stack.info["tokens"]["api_admin_token"]):
        resp = _call(stack, method, path, token)
        assert resp.status_code not in (401, 403, 500), resp.text  # 404/409/422: the request itself is bad
        assert "error" in resp.json() or resp.status_code == 200


def test_pool_delete_needs_admin(stack: Stack) -> None:
    resp = _call(stack, "DELETE", "/pool/none-1", stack.info["tokens"]["api_token"])
    assert resp.status_code == 403 and resp.json()["error"]["code"] == "forbidden"
    resp = _call(stack, "DELETE", "/pool/none-1", stack.info["tokens"]["api_admin_token"])
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"


def test_worker_routes_need_the_worker_scope(stack: Stack) -> None:
    """Issue 12: only the worker token may fetch a job's inputs or upload a checkpoint; it opens nothing else."""
    t = stack.info["tokens"]
    for method, path in WORKER_ROUTES:
        for token in (t["api_token"], t["api_admin_token"]):
            resp = _call(stack, method, path, token)
            assert resp.status_code == 403 and resp.json()["error"]["code"] == "forbidden", (method, path, resp.text)
        assert _call(stack, method, path, t["api_worker_token"]).status_code in (200, 404, 422), (method, path)
    for method, path in USER_ROUTES + ADMIN_ROUTES:
        assert _call(stack, method, path, t["api_worker_token"]).status_code == 403, (method, path)


def test_worker_start_up_checks_redis_and_the_api(stack: Stack, tmp_path: Path) -> None:
    """Issue 12: a worker needs Redis and the API (URL + worker token); each missing or wrong piece stops it at
    start-up with one line naming the variable to fix. With everything right its health check passes."""
    from t3ar.ports import free_port

    t = stack.info["tokens"]
    base = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "shared"), str(ROOT), *inherited_path()]),
            "T3AR_WORKER_REDIS_URL": stack.info["redis_url"], "T3AR_WORKER_API_URL": stack.info["api_url"],
            "T3AR_WORKER_API_TOKEN": t["api_worker_token"], "T3AR_WORKER_DATA_DIR": str(tmp_path),
            "T3AR_WORKER_API_RETRIES": "0"}
    cases = [({"T3AR_WORKER_API_TOKEN": "wrong"}, "is not the API's worker token"),
             ({"T3AR_WORKER_API_TOKEN": t["api_token"]}, "is not the API's worker token"),
             ({"T3AR_WORKER_API_TOKEN": ""}, "no worker token is set (T3AR_WORKER_API_TOKEN)"),
             ({"T3AR_WORKER_API_URL": f"http://127.0.0.1:{free_port()}"}, "(T3AR_WORKER_API_URL) cannot be used"),
             ({"T3AR_WORKER_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"},
              "(T3AR_WORKER_REDIS_URL) does not answer")]
    for extra, expect in cases:
        env = {k: v for k, v in {**base, **extra}.items() if v}
        out = subprocess.run([sys.executable, "-m", "t3ar_services.worker", "--burst"], env=env, capture_output=True,
                             text=True, timeout=120, cwd=ROOT)
        assert out.returncode == 2 and expect in out.stderr, (extra, out.returncode, out.stderr[-2000:])
    ok = subprocess.run([sys.executable, "-m", "t3ar_services.worker", "check"], env=base, capture_output=True,
                        text=True, timeout=120, cwd=ROOT)
    assert ok.returncode == 0, ok.stderr[-2000:]  # the API takes the token, and worker-1 of this host is registered


def test_retriever_tokens_are_not_api_tokens(stack: Stack) -> None:
    resp = _call(stack, "GET", "/jobs", stack.info["tokens"]["retriever_admin_token"])
    assert resp.status_code == 401


def test_embedded_redis_requires_its_password(stack: Stack) -> None:
    """Issue 11, finding 1: a local user without the stack's Redis password cannot reach the job queue."""
    from urllib.parse import urlsplit

    from redis import Redis
    from redis.exceptions import RedisError

    port = urlsplit(stack.info["redis_url"]).port
    with pytest.raises(RedisError, match="(?i)auth"):
        Redis(host="127.0.0.1", port=port, socket_timeout=5).ping()
    assert stack.redis().ping()


def test_worker_refuses_a_foreign_job_without_running_it(stack: Stack, tmp_path: Path) -> None:
    """Issue 11, finding 1, the worker's side: even with Redis access, a queued `os.system` never runs."""
    from rq import Queue
    from rq.job import JobStatus

    from t3ar_services.common.job_contract import SERIALIZER

    marker = tmp_path / "owned"
    queue = Queue("t3ar-adapt", connection=stack.redis(), serializer=SERIALIZER)
    job = queue.enqueue_call("os.system", args=(f"touch {marker}",))
    deadline = time.monotonic() + 120
    while job.get_status(refresh=True) not in (JobStatus.FAILED, JobStatus.FINISHED) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert job.get_status() == JobStatus.FAILED
    result = job.latest_result()
    assert result is not None and "refused" in (result.exc_string or "")
    assert not marker.exists()
    assert "refusing job" in stack.log("worker-1")
    # and the worker's Prometheus metrics count it (issue 11, observability)
    text = httpx.get(stack.info["worker_metrics"][0], timeout=10).text
    refused = [line for line in text.splitlines() if line.startswith('t3ar_worker_jobs_total{outcome="refused"}')]
    assert refused and float(refused[0].split()[-1]) >= 1, text[:2000]
    assert "process_resident_memory_bytes" in text

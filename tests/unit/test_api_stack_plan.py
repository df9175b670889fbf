"""`t3ar up` wiring without starting anything: tokens, per-process environments, the redis-server binary."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from t3ar.cli.stack_cmd import plan
from t3ar.cli.stack_procs import free_port, load_tokens, redis_server_binary


def test_tokens_are_random_private_and_kept(tmp_path: Path) -> None:
    tokens = load_tokens(tmp_path / "tokens.json")
    assert len(set(tokens.values())) == 4 and all(len(t) >= 24 for t in tokens.values())
    assert stat.S_IMODE((tmp_path / "tokens.json").stat().st_mode) == 0o600
    assert load_tokens(tmp_path / "tokens.json") == tokens


def test_plan_wires_every_process(tmp_path: Path) -> None:
    ports = {"api": 1001, "retriever": 1002, "redis": 1003}
    children, info = plan(tmp_path, ports, 2, no_auth=False)
    by = {c.name: c for c in children}
    assert list(by) == ["redis", "retriever", "api", "worker-1", "worker-2"]
    t = info["tokens"]
    assert by["redis"].argv[:3] == [redis_server_binary(), "--port", "1003"] and "127.0.0.1" in by["redis"].argv
    assert by["retriever"].env["T3AR_RETRIEVER_ADMIN_TOKEN"] == t["retriever_admin_token"]
    api = by["api"].env
    assert api["T3AR_API_REDIS_URL"] == "redis://127.0.0.1:1003/0" == info["redis_url"]
    assert api["T3AR_API_RETRIEVER_URL"] == "http://127.0.0.1:1002" and api["T3AR_API_TOKEN"] == t["api_token"]
    assert api["T3AR_API_RETRIEVER_ADMIN_TOKEN"] == t["retriever_admin_token"]
    worker = by["worker-1"].env
    assert worker["T3AR_WORKER_DATA_DIR"] == api["T3AR_API_DATA_DIR"]
    assert worker["T3AR_WORKER_RETRIEVER_TOKEN"] == t["retriever_token"]
    assert "T3AR_WORKER_RETRIEVER_ADMIN_TOKEN" not in worker and "T3AR_API_ADMIN_TOKEN" not in worker
    assert by["worker-1"].argv[1:] == ["-m", "services.worker"]  # never the torch-importing CLI


def test_plan_without_auth(tmp_path: Path) -> None:
    children, info = plan(tmp_path, {"api": 1, "retriever": 2, "redis": 3}, 0, no_auth=True)
    assert info["tokens"] == {} and not info["auth"]
    env = {c.name: c.env for c in children}
    assert env["api"]["T3AR_API_AUTH_DISABLED"] == "true"
    assert env["api"].get("T3AR_API_TOKEN") == os.environ.get("T3AR_API_TOKEN")  # not set by `up`


def test_free_port() -> None:
    assert 1024 < free_port() < 65536

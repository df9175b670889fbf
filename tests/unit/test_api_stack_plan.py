"""`t3ar up` wiring without starting anything: tokens, per-process environments, the redis-server binary."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from t3ar.ports import free_port
from t3ar_services.cli.stack import plan
from t3ar_services.cli.stack_procs import load_tokens, redis_server_binary


def test_tokens_are_random_private_and_kept(tmp_path: Path) -> None:
    tokens = load_tokens(tmp_path / "tokens.json")
    assert len(set(tokens.values())) == 6 and all(len(t) >= 24 for t in tokens.values())
    assert "redis_password" in tokens
    assert stat.S_IMODE((tmp_path / "tokens.json").stat().st_mode) == 0o600
    assert load_tokens(tmp_path / "tokens.json") == tokens


def test_plan_wires_every_process(tmp_path: Path) -> None:
    ports = {"api": 1001, "retriever": 1002, "redis": 1003}
    children, info = plan(tmp_path, ports, 2, no_auth=False)
    by = {c.name: c for c in children}
    assert list(by) == ["redis", "retriever", "api", "worker-1", "worker-2"]
    t = info["tokens"]
    redis_argv = by["redis"].argv
    assert redis_argv[0] == redis_server_binary() and redis_argv[2:4] == ["--port", "1003"]
    assert "127.0.0.1" in redis_argv
    # the embedded Redis requires a password that only the stack's processes get (issue 11, finding 1): it
    # is in a private config file, never on a command line that `ps` shows every local user
    password = load_tokens(tmp_path / "tokens.json")["redis_password"]
    conf = Path(redis_argv[1])
    assert conf.read_text().split() == ["requirepass", password] and stat.S_IMODE(conf.stat().st_mode) == 0o600
    assert not any(password in a for a in redis_argv)
    assert by["retriever"].env["T3AR_RETRIEVER_ADMIN_TOKEN"] == t["retriever_admin_token"]
    api = by["api"].env
    assert api["T3AR_API_REDIS_URL"] == f"redis://:{password}@127.0.0.1:1003/0" == info["redis_url"]
    assert by["worker-1"].env["T3AR_WORKER_REDIS_URL"] == info["redis_url"]
    assert "redis_password" not in t  # the printed tokens are the services' only
    assert api["T3AR_API_RETRIEVER_URL"] == "http://127.0.0.1:1002" and api["T3AR_API_TOKEN"] == t["api_token"]
    assert api["T3AR_API_RETRIEVER_ADMIN_TOKEN"] == t["retriever_admin_token"]
    worker = by["worker-1"].env
    # issue 12: a worker of `t3ar up` takes the same HTTP path as one on another host: URLs, tokens and a data
    # dir of its own; nothing in its environment names the API's data dir
    assert worker["T3AR_WORKER_DATA_DIR"] == str(tmp_path / "worker") != api["T3AR_API_DATA_DIR"]
    assert not any(api["T3AR_API_DATA_DIR"] in v for v in worker.values())
    assert worker["T3AR_WORKER_API_URL"] == info["api_url"] == "http://127.0.0.1:1001"
    assert info["console_url"] == "http://127.0.0.1:1001/ui"  # issue 27: `t3ar up` prints it
    assert worker["T3AR_WORKER_API_TOKEN"] == t["api_worker_token"] == api["T3AR_API_WORKER_TOKEN"]
    assert len({t["api_worker_token"], t["api_token"], t["api_admin_token"]}) == 3
    assert worker["T3AR_WORKER_RETRIEVER_TOKEN"] == t["retriever_token"]
    assert "T3AR_WORKER_RETRIEVER_ADMIN_TOKEN" not in worker and "T3AR_API_ADMIN_TOKEN" not in worker
    assert by["worker-1"].argv[1:] == ["-m", "t3ar_services.worker"]  # never the torch-importing CLI
    ports = [by[f"worker-{i}"].env["T3AR_WORKER_METRICS_PORT"] for i in (1, 2)]
    assert len(set(ports)) == 2 and info["worker_metrics"] == [f"http://127.0.0.1:{p}/metrics" for p in ports]


def test_plan_without_auth(tmp_path: Path) -> None:
    children, info = plan(tmp_path, {"api": 1, "retriever": 2, "redis": 3}, 0, no_auth=True)
    assert info["tokens"] == {} and not info["auth"]
    # API auth off, but Redis keeps its password
    assert info["redis_url"].startswith("redis://:") and "@127.0.0.1:3/" in info["redis_url"]
    env = {c.name: c.env for c in children}
    assert env["api"]["T3AR_API_AUTH_DISABLED"] == "true"
    assert env["api"].get("T3AR_API_TOKEN") == os.environ.get("T3AR_API_TOKEN")  # not set by `up`


def test_free_port_is_never_one_the_kernel_hands_out_by_itself(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from t3ar import ports

    monkeypatch.delenv(ports.RANGE_ENV, raising=False)  # the test command's lanes set it
    lo, _ = ports.ephemeral_range()
    got = [free_port() for _ in range(20)]
    assert len(set(got)) == 20 and all(1024 <= p < lo for p in got)  # below the bind(0) range, all distinct
    for p in got[:3]:  # free: a child can bind it
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
    ranges = tmp_path / "ip_local_port_range"
    monkeypatch.setattr(ports, "EPHEMERAL_FILE", ranges)
    ranges.write_text("40000\t50000\n")
    assert ports.ephemeral_range() == (40000, 50000) and 28000 <= free_port() < 40000
    ranges.write_text("1100 65000\n")  # no room below the range: the kernel's choice
    assert 1100 <= free_port() <= 65535
    ranges.unlink()  # not Linux: the kernel's default range
    assert ports.ephemeral_range() == (32768, 60999)


def test_free_ports_come_from_the_configured_range(monkeypatch: pytest.MonkeyPatch) -> None:
    from t3ar import ports

    monkeypatch.setenv(ports.RANGE_ENV, "21000-21100")
    assert ports.port_range() == (21000, 21100)
    got = {free_port() for _ in range(10)}
    assert len(got) == 10 and all(21000 <= p < 21100 for p in got)
    for bad in ("21000", "a-b", "21100-21000", "80-2000", "60000-70000", "1-2-3"):
        monkeypatch.setenv(ports.RANGE_ENV, bad)
        with pytest.raises(ValueError, match="T3AR_FREE_PORT_RANGE"):
            free_port()


def test_redact_url() -> None:
    from t3ar.urls import redact_url

    assert redact_url("redis://:s3cret@127.0.0.1:6379/0") == "redis://***@127.0.0.1:6379/0"
    assert redact_url("redis://user:pw@host/0?x=a@b") == "redis://***@host/0?x=a@b"
    assert redact_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert redact_url("http://host/a@b") == "http://host/a@b"


def test_plan_with_mlflow_starts_its_tracking_server_before_the_api(tmp_path: Path) -> None:
    """`t3ar up --mlflow` (issue 51): MLflow's server on 127.0.0.1 with a SQLite backend and local artifact store in
    the data directory, before the API, which registers in it; without it the API gets no tracking URI."""
    pytest.importorskip("mlflow")
    ports = {"api": 1001, "retriever": 1002, "redis": 1003}
    children, info = plan(tmp_path, ports, 1, no_auth=False, mlflow_port=1004)
    by = {c.name: c for c in children}
    assert list(by) == ["redis", "retriever", "mlflow", "api", "worker-1"]
    argv = by["mlflow"].argv
    assert argv[1] == "server" and argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--port") + 1] == "1004"
    store = (tmp_path / "mlflow" / "mlflow.sqlite3").resolve()
    assert argv[argv.index("--backend-store-uri") + 1] == f"sqlite:///{store}"
    assert argv[argv.index("--artifacts-destination") + 1] == str((tmp_path / "mlflow" / "artifacts").resolve())
    assert info["mlflow_url"] == "http://127.0.0.1:1004"
    assert by["api"].env["T3AR_MLFLOW_TRACKING_URI"] == "http://127.0.0.1:1004"
    assert "T3AR_MLFLOW_TRACKING_URI" not in by["worker-1"].env or \
        by["worker-1"].env["T3AR_MLFLOW_TRACKING_URI"] == os.environ.get("T3AR_MLFLOW_TRACKING_URI")
    children, info = plan(tmp_path, ports, 1, no_auth=False)
    assert "mlflow" not in [c.name for c in children] and info["mlflow_url"] is None

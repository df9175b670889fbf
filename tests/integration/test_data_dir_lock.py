"""Issue 29 F10: two writers on one pool. A second retriever (or API) on a data directory that a live one
serves refuses to start, naming the holder's pid, and the first keeps serving; real uvicorn processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from t3ar.ports import free_port

if TYPE_CHECKING:  # (conftest is imported by name only under TYPE_CHECKING: the e2e folder has one too)
    from conftest import RetrieverProcess

REPO = Path(__file__).resolve().parents[2]

VECTORS = {"T3AR_RETRIEVER_EMBEDDER": "none", "T3AR_RETRIEVER_VECTOR_DIM": "8",
           "T3AR_RETRIEVER_VECTOR_IDENTITY": "synthetic"}


def test_a_second_retriever_on_a_served_pool_refuses_to_start(
        tmp_path: Path, retriever_factory: Callable[..., RetrieverProcess]) -> None:
    first = retriever_factory(tmp_path / "pool", VECTORS)
    second = retriever_factory(tmp_path / "pool", VECTORS, wait=None)
    assert second.proc.wait(timeout=120) != 0
    assert f"in use by process {first.proc.pid}" in second.log(), second.log()[-2000:]
    assert httpx.get(first.url + "/ready", timeout=10).status_code == 200
    first.stop()
    third = retriever_factory(tmp_path / "pool", VECTORS)  # the lock went with the process
    assert httpx.get(third.url + "/ready", timeout=10).status_code == 200


def _api(data_dir: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    pypath = [str(REPO / "shared"), str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(pypath),
           "T3AR_API_DATA_DIR": str(data_dir), "T3AR_API_AUTH_DISABLED": "true",
           "T3AR_API_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0", "T3AR_API_SWEEP_INTERVAL": "3600"}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "--factory", "t3ar_services.api.main:create_app",
                                 "--host", "127.0.0.1", "--port", str(port)], cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def test_a_second_api_on_a_served_data_dir_refuses_to_start(tmp_path: Path) -> None:
    first, url = _api(tmp_path / "api", tmp_path / "first.log")
    second = None
    try:
        deadline = time.monotonic() + 120
        while True:
            assert first.poll() is None and time.monotonic() < deadline, (tmp_path / "first.log").read_text()
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        second, _ = _api(tmp_path / "api", tmp_path / "second.log")
        assert second.wait(timeout=60) != 0
        assert f"in use by process {first.pid}" in (tmp_path / "second.log").read_text()
        assert httpx.get(url + "/health", timeout=10).status_code == 200
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()

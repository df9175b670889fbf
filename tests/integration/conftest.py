"""Integration fixtures.

Retriever: ``start_retriever(data_dir, env)`` launches a real uvicorn process (``--factory
t3ar_services.retriever.main:create_app``) on 127.0.0.1 with a free port and a real data directory, waits for
``/ready`` and is stopped at teardown. ``retriever_png(seed)`` makes small, visually distinct PNGs.

Milvus: ``milvus_server`` is one real Milvus standalone server for the session (tests marked ``milvus_server``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from milvus_server import MilvusServer, MilvusServerError, MilvusServerUnavailable, stop_process

from t3ar.clients.retriever import RetrieverClient
from t3ar.ports import free_port
from t3ar_bench.retrieval.service import shapes_png

REPO = Path(__file__).resolve().parents[2]
MILVUS_START_TIMEOUT = 600  # seconds: the first start unpacks the binaries (17 s here), later ones ~10 s

# ---------------------------------------------------------------------------------------------- retriever
RETRIEVER_TOKEN = "test-rw-token"
RETRIEVER_ADMIN_TOKEN = "test-admin-token"


@dataclass
class RetrieverProcess:
    url: str
    data_dir: Path
    proc: subprocess.Popen[bytes]
    log_path: Path

    def client(self, token: str | None = RETRIEVER_ADMIN_TOKEN, **kwargs: object) -> RetrieverClient:
        return RetrieverClient(self.url, token, **kwargs)  # type: ignore[arg-type]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        """Stop (SIGTERM: graceful, SIGKILL: crash) and return the exit code."""
        return stop_process(self.proc, sig, timeout)


def start_retriever(data_dir: Path, env: dict[str, str] | None = None, *, wait: str | None = "/ready",
                    timeout: float = 120) -> RetrieverProcess:
    """Start a retriever on a free port. ``wait``: endpoint to poll until 200 (None: do not wait)."""
    port = free_port()
    # the caller's PYTHONPATH stays (after this checkout's shared/): a worktree maps t3ar_services onto its own code
    pypath = os.pathsep.join(p for p in (str(REPO / "shared"), str(REPO), os.environ.get("PYTHONPATH")) if p)
    full_env = {**os.environ, "PYTHONPATH": pypath,
                "T3AR_RETRIEVER_DATA_DIR": str(data_dir), "T3AR_RETRIEVER_TOKEN": RETRIEVER_TOKEN,
                "T3AR_RETRIEVER_ADMIN_TOKEN": RETRIEVER_ADMIN_TOKEN, "OMP_NUM_THREADS": "2", **(env or {})}
    log_path = data_dir.parent / f"{data_dir.name}-retriever-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--factory", "t3ar_services.retriever.main:create_app",
             "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
            cwd=REPO, env=full_env, stdout=log, stderr=subprocess.STDOUT)
    rp = RetrieverProcess(f"http://127.0.0.1:{port}", data_dir, proc, log_path)
    if wait is None:
        return rp
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"retriever exited with {proc.returncode}:\n{rp.log()[-3000:]}")
        try:
            if httpx.get(rp.url + wait, timeout=2).status_code == 200:
                return rp
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    rp.stop(signal.SIGKILL)
    raise RuntimeError(f"retriever not ready after {timeout}s:\n{rp.log()[-3000:]}")


@pytest.fixture
def retriever_factory() -> Iterator[Callable[..., RetrieverProcess]]:
    """``start(data_dir, env=None, wait="/ready")``; every process started is stopped at teardown."""
    started: list[RetrieverProcess] = []

    def start(data_dir: Path, env: dict[str, str] | None = None, **kwargs: object) -> RetrieverProcess:
        rp = start_retriever(data_dir, env, **kwargs)  # type: ignore[arg-type]
        started.append(rp)
        return rp

    yield start
    for rp in started:
        rp.stop(signal.SIGKILL)


@pytest.fixture(scope="module")
def retriever_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RetrieverProcess]:
    """One retriever (default embedder, auth on) shared by a test module."""
    rp = start_retriever(tmp_path_factory.mktemp("retriever") / "pool")
    yield rp
    rp.stop(signal.SIGKILL)


def retriever_png(seed: int, size: int = 64) -> bytes:
    """A PNG of a few coloured shapes (pairwise cosine < 0.9 under the default embedder for seeds 0..59)."""
    return shapes_png(seed, size, noise=True)


@pytest.fixture(scope="session")
def make_png() -> Callable[..., bytes]:
    return retriever_png


# ---------------------------------------------------------------------------------------------- Milvus server
@pytest.fixture(scope="session")
def milvus_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MilvusServer]:
    """One real Milvus standalone server (PyPI ``milvus`` 2.3.5, tests/integration/milvus_server.py) for the whole
    session, on 127.0.0.1 with free ports and a data directory under tmp; every pool uses its own collection.
    Tests that restart or kill it leave it running again. Skips, naming the cause, when the package is missing or
    the binary cannot run here; a server that is there but fails to start or to become healthy is a failure (CI
    installs it: a broken server must not pass as a skip)."""
    try:
        server = MilvusServer(tmp_path_factory.mktemp("milvus-server"))
        server.start(timeout=MILVUS_START_TIMEOUT)
    except MilvusServerUnavailable as e:
        pytest.skip(f"no real Milvus server: {str(e)[:2000]}")
    except MilvusServerError as e:
        pytest.fail(f"the real Milvus server did not start: {str(e)[:4000]}")
    yield server
    server.kill()  # its data is thrown away: no graceful stop (up to GRACEFUL_STOP_S)

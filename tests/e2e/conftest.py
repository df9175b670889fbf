"""End-to-end fixtures: the embedded stack (`t3ar up`: real redis-server, retriever, API and an rq worker as
processes on free 127.0.0.1 ports, one tmp data dir), a tiny base model and a small synthetic pool.

The models are tiny (MobileNetV2-0.5 at 32 px, random init) because these tests are about the plumbing; the
retriever embeds at 32 px for the same reason. Heartbeat/sweep intervals are shortened so a killed worker is
noticed in seconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from stack_helpers import CLASSES, ROOT, Stack, inherited_path, png, target_zip, tiny_checkpoint


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    data = tmp_path_factory.mktemp("stack")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "shared"), str(ROOT), *inherited_path()]),
               T3AR_RETRIEVER_EMBEDDER_IMAGE_SIZE="32", T3AR_RETRIEVER_EMBED_BATCH_SIZE="16",
               T3AR_WORKER_MONITOR_INTERVAL="1", T3AR_WORKER_ABANDON_GRACE="3", T3AR_WORKER_PROGRESS_INTERVAL="0.2",
               T3AR_WORKER_TORCH_THREADS="1", T3AR_API_SWEEP_INTERVAL="1")
    out = open(data / "up.log", "wb")  # noqa: SIM115 - closed at teardown
    proc = subprocess.Popen([sys.executable, "-m", "t3ar.cli.main", "up", "--data-dir", str(data), "--api-port", "0",
                             "--retriever-port", "0", "--workers", "1"], env=env, stdout=out, stderr=subprocess.STDOUT,
                            cwd=ROOT)
    deadline = time.monotonic() + 300
    while not (data / "stack.json").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"t3ar up did not start:\n{(data / 'up.log').read_text()[-4000:]}")
        time.sleep(0.5)
    info = json.loads((data / "stack.json").read_text())
    try:
        yield Stack(data, info, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
        out.close()


@pytest.fixture(scope="session")
def model_id(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> str:
    ckpt = tiny_checkpoint(tmp_path_factory.mktemp("models") / "base.pt")
    with stack.api() as api:
        return str(api.upload_model(ckpt, "tiny")["id"])


@pytest.fixture(scope="session")
def pool_ids(stack: Stack) -> list[str]:
    rng = np.random.default_rng(1)
    images = [(f"pool-{i}.png", png(CLASSES[i % 3], rng)) for i in range(24)]
    with stack.retriever() as rc:
        out = rc.add_images(images, source="e2e", duplicate_policy="keep")
    ids = [it["id"] for it in out["items"] if it["status"] == "added"]
    assert len(ids) >= 20, out
    return ids


@pytest.fixture(scope="session")
def labelled_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return target_zip(tmp_path_factory.mktemp("targets") / "labelled.zip")

"""End-to-end fixtures: the embedded stack (`t3ar up`: real redis-server, retriever, API and an rq worker as
processes on free 127.0.0.1 ports, one tmp data dir), a tiny base model and a small synthetic pool.

The models are tiny (MobileNetV2-0.5 at 32 px, random init) because these tests are about the plumbing; the
retriever embeds at 32 px for the same reason. Heartbeat/sweep intervals are shortened so a killed worker is
noticed in seconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from stack_helpers import CLASSES, Stack, png, running_stack, target_zip, upload_tiny_model


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("stack")) as st:
        yield st


@pytest.fixture(scope="session")
def model_id(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> str:
    return upload_tiny_model(stack, tmp_path_factory.mktemp("models"), "tiny")


@pytest.fixture(scope="session")
def pool_ids(stack: Stack) -> list[str]:
    rng = np.random.default_rng(1)
    images = [(f"pool-{i}.png", png(CLASSES[i % 3], rng)) for i in range(24)]
    with stack.retriever() as rc:
        out = rc.add_images(images, source="e2e", duplicate_policy="keep")
    ids = [it.id for it in out.items if it.status == "added"]
    assert len(ids) >= 20, out
    return ids


@pytest.fixture(scope="session")
def labelled_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return target_zip(tmp_path_factory.mktemp("targets") / "labelled.zip")

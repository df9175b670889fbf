"""Helpers of the end-to-end tests (the fixtures are in conftest.py): the :class:`Stack` handle, synthetic
images and archives, tiny checkpoints, polling."""

from __future__ import annotations

import io
import json
import os
import subprocess
import time
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from t3ar.clients.api import ApiClient
from t3ar.clients.retriever import RetrieverClient
from t3ar.stack_process import StackStartError, running_up

ROOT = Path(__file__).resolve().parents[2]
CLASSES = ("blue", "green", "red")
FAST_JOB = {"method": "t3ar", "k": 2, "r": 2, "epochs": 1, "batch_size": 4, "bank_size": 64}
LONG_JOB = {**FAST_JOB, "epochs": 1000}


def fast_job(method: str, **extra: Any) -> dict[str, Any]:
    """:data:`FAST_JOB` for ``method``: only the options its config takes (another method's option is a 422)."""
    from t3ar.method import config as method_config

    accepted = method_config.config_class(method).flat_fields()
    return {**{k: v for k, v in FAST_JOB.items() if k in accepted}, "method": method, **extra}


@dataclass
class Stack:
    data_dir: Path
    info: dict[str, Any]
    proc: subprocess.Popen[bytes]

    def api(self, scope: str | None = "user") -> ApiClient:
        t = self.info["tokens"]
        token = {"user": t["api_token"], "admin": t["api_admin_token"], None: None}.get(scope, scope)
        return ApiClient(self.info["api_url"], token, retries=2)

    def retriever(self) -> RetrieverClient:
        return RetrieverClient(self.info["retriever_url"], self.info["tokens"]["retriever_token"])

    def pids(self) -> dict[str, int]:
        return dict(json.loads((self.data_dir / "stack.json").read_text())["pids"])

    def redis(self) -> Any:
        from redis import Redis

        return Redis.from_url(self.info["redis_url"])

    def log(self, name: str) -> str:
        return (self.data_dir / "logs" / f"{name}.log").read_text(errors="replace")


def inherited_path() -> list[str]:
    """This process' PYTHONPATH entries, after the checkout's own: a checkout whose ``t3ar_services`` is put on
    the path (a worktree beside an installed one) starts the stack from its own code."""
    return [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]


def png(color: str, rng: np.random.Generator, size: int = 40) -> bytes:
    """A noisy image dominated by one colour channel: real PNG bytes a classifier can learn."""
    a = rng.integers(0, 90, (size, size, 3), dtype=np.uint8)
    a[..., {"red": 0, "green": 1, "blue": 2}[color]] += 150
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    return buf.getvalue()


def target_zip(path: Path, *, per_class: int = 3, labels: bool = True, seed: int = 0,
               classes: tuple[str, ...] = CLASSES) -> Path:
    rng = np.random.default_rng(seed)
    rows = ["path,label"]
    with zipfile.ZipFile(path, "w") as zf:
        for c in classes:
            for i in range(per_class):
                name = f"images/{c}-{i}.png"
                zf.writestr(name, png(c if c in ("red", "green", "blue") else "red", rng))
                rows.append(f"{name},{c}")
        if labels:
            zf.writestr("labels.csv", "\n".join(rows) + "\n")
    return path


def upload_tiny_model(stack: Any, folder: Path, name: str) -> str:
    """A tiny base model uploaded to ``stack``'s API; its id."""
    ckpt = tiny_checkpoint(folder / "base.pt")
    with stack.api() as api:
        return api.upload_model(ckpt, name).id


def tiny_checkpoint(path: Path, classes: tuple[str, ...] = CLASSES) -> Path:
    from t3ar.models.backbones import BackboneSpec
    from t3ar.models.checkpoint import save_checkpoint
    from t3ar.models.classifier import ModelSpec, build_classifier

    spec = ModelSpec(backbone=BackboneSpec(name="mobilenetv2_050", weights="none"), classes=classes, image_size=32)
    save_checkpoint(path, build_classifier(spec), spec)
    return path


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.3) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@contextmanager
def running_stack(data: Path, env: Mapping[str, str | None] | None = None,
                  start_timeout: float = 300) -> Iterator[Stack]:
    """`t3ar up` in ``data`` (one worker, free ports, short heartbeats), stopped with SIGTERM at the end. ``env``
    overrides the settings below (None: leave the service's default); ``data`` may hold an earlier stack's state
    (a restart): its log is appended to."""
    full = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "shared"), str(ROOT), *inherited_path()]),
                T3AR_RETRIEVER_EMBEDDER_IMAGE_SIZE="32", T3AR_RETRIEVER_EMBED_BATCH_SIZE="16",
                T3AR_WORKER_MONITOR_INTERVAL="1", T3AR_WORKER_ABANDON_GRACE="3", T3AR_WORKER_PROGRESS_INTERVAL="0.2",
                T3AR_WORKER_TORCH_THREADS="1", T3AR_API_SWEEP_INTERVAL="1",
                T3AR_API_AUTH_FAILURES="1000000")  # the auth tests send hundreds of wrong tokens from one address
    for key, value in (env or {}).items():
        if value is None:
            full.pop(key, None)
        else:
            full[key] = value
    with ExitStack() as stack:
        try:
            proc, info = stack.enter_context(running_up(data, full, data / "up.log", cwd=ROOT,
                                                        start_timeout=start_timeout))
        except StackStartError as e:
            # pytest.fail, without the StackStartError's traceback: the message (the log's end) says it all
            raise pytest.fail.Exception(str(e)) from None
        yield Stack(data, info, proc)

"""What the retriever benchmarks share (:mod:`.main`, :mod:`.backends`, :mod:`t3ar_bench.curation`): the synthetic
vectors' shape, a retriever service started as a real subprocess on 127.0.0.1 (``t3ar serve retriever``: the
library never names the services), a process's CPU time and resident memory, latency percentiles."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from t3ar.clients.retriever import RetrieverClient
from t3ar.ports import free_port

DIM, K, BATCH = 512, 50, 256
RW, ADMIN = "bench-rw", "bench-admin"


def unit_vectors(n: int, seed: int) -> np.ndarray:
    """``n`` seeded random unit vectors of :data:`DIM` (float32)."""
    v = np.random.default_rng(seed).standard_normal((n, DIM), dtype=np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int | None:
    """A process's resident memory (Linux /proc); None when it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@contextmanager
def retriever_service(data_dir: Path, env: dict[str, str]) -> Iterator[tuple[RetrieverClient, subprocess.Popen[bytes]]]:
    """A retriever serving ``data_dir`` (with ``env`` on top of the benchmark's tokens) until the block ends; yields
    an admin client and the process. Its log goes to ``<data_dir>.log``."""
    port = free_port()  # not from bind(0): the milvus retriever's lite server binds port 0 before uvicorn binds
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
                "T3AR_RETRIEVER_DATA_DIR": str(data_dir), "T3AR_RETRIEVER_TOKEN": RW,
                "T3AR_RETRIEVER_ADMIN_TOKEN": ADMIN, **env}
    logf = open(data_dir.parent / f"{data_dir.name}.log", "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "t3ar.cli.main", "serve", "retriever", "--data-dir", str(data_dir),
                             "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
                            env=full_env, stdout=logf, stderr=logf)
    client = RetrieverClient(f"http://127.0.0.1:{port}", ADMIN, timeout=600)
    try:
        deadline = time.monotonic() + 900
        while not client.ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"retriever failed to start; see {logf.name}")
            time.sleep(0.2)
        yield client, proc
    finally:
        client.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        logf.close()


def percentiles(seconds: list[float], *, with_max: bool = True) -> dict[str, float]:
    """p50 / p99 (and the maximum) in milliseconds of ``seconds``, with their count."""
    ms = np.asarray(seconds) * 1000
    out = {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99))}
    if with_max:
        out["max_ms"] = float(ms.max())
    return {**out, "n": len(ms)}


def shapes_png(seed: int, size: int = 64, *, noise: bool = False, nudge: bool = False) -> bytes:
    """A PNG of a few coloured shapes on a coloured ground, the same for the same seed (pairwise cosine < 0.9 under
    the default embedder for seeds 0..59): the benchmarks' and tests' synthetic pool images. ``noise``: pixel
    noise on odd seeds; ``nudge``: one pixel changed (other bytes, the same picture to the embedder)."""
    import io

    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    img = Image.new("RGB", (size, size), tuple(int(x) for x in rng.integers(0, 256, 3)))
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(2, 6))):
        x, y = (int(v) for v in rng.integers(0, size, 2))
        box = [x, y, x + int(rng.integers(8, 40)), y + int(rng.integers(8, 40))]
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.rectangle if rng.integers(0, 2) else draw.ellipse)(box, fill=colour)
    arr = np.asarray(img).astype(int)
    if noise:
        arr = arr + rng.integers(-30, 30, (size, size, 3)) * (seed % 2)
    if nudge:
        arr[0, 0] = (arr[0, 0] + 7) % 256
    buf = io.BytesIO()
    Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8)).save(buf, format="PNG")
    return buf.getvalue()

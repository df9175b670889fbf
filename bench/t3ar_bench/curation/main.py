"""Time pool compaction's scan (``POST /pool/near-duplicates``) on a large synthetic vectors-only pool.

A real retriever (``t3ar serve retriever``, vectors-only, 512-d) is filled through ``POST /pool/vectors``:
half of the pool is ``clipart`` (never removed), half ``target:bench`` (may be removed), drawn from the
structured generator of the retrieval benchmark (a Gaussian mixture matched to real embeddings); a share of the
``target:bench`` items are planted near-duplicates (an earlier item plus noise, cosine ~0.995). The scan is
asked with ``sources=["target:*"]``; the report gives its wall time over HTTP and the service's own breakdown
(read the snapshot, build the index, range search), how many planted duplicates it found (recall) and how many
removals were not planted (false removals), and the retriever's resident memory. No test asserts any of this.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from t3ar_bench.retrieval.ann import mixture_vectors
from t3ar_bench.retrieval.service import cpu_seconds, retriever_service, rss_bytes

DIM = 512
CHUNK = 100_000


def _planted(n: int, share: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(vectors [n, DIM], is_target [n], planted [n]): the second half is target; ``share`` of the pool are
    near-copies of earlier items placed among the target half."""
    x = mixture_vectors(n, seed=seed, dim=DIM)
    rng = np.random.default_rng(seed + 1)
    half = n // 2
    k = int(n * share)
    rows = np.sort(rng.choice(np.arange(half, n), size=k, replace=False))
    orig = np.array([rng.integers(0, r) for r in rows])
    noise = rng.standard_normal((k, DIM)).astype(np.float32)
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    copies = x[orig] + 0.1 * noise  # cosine ~0.995
    x[rows] = copies / np.linalg.norm(copies, axis=1, keepdims=True)
    target = np.zeros(n, dtype=bool)
    target[half:] = True
    planted = np.zeros(n, dtype=bool)
    planted[rows] = True
    return x.astype(np.float32), target, planted


def run(items: int, share: float, threshold: float, nprobe: int, work: Path) -> dict[str, Any]:
    vecs, target, planted = _planted(items, share, seed=11)
    env = {"T3AR_RETRIEVER_EMBEDDER": "none", "T3AR_RETRIEVER_VECTOR_DIM": str(DIM),
           "T3AR_RETRIEVER_VECTOR_IDENTITY": "synthetic"}
    with retriever_service(work / "pool", env) as (client, proc):
        t0 = time.perf_counter()
        ids: list[str] = []
        for start in range(0, items, CHUNK):
            stop = min(items, start + CHUNK)
            for lo, hi, src in ((start, min(stop, items // 2), "clipart"), (max(start, items // 2), stop,
                                                                             "target:bench")):
                if lo < hi:
                    ids += client.add_vectors(vecs[lo:hi], identity="synthetic", source=src)
        load_s = time.perf_counter() - t0
        del vecs  # 2 GiB at 1 M: the retriever's scan needs the memory more than this process
        rss_before = rss_bytes(proc.pid)
        t1, c1 = time.perf_counter(), cpu_seconds(proc.pid)
        out = client.near_duplicates(threshold=threshold, sources=["target:*"], nprobe=nprobe)
        scan_s, scan_cpu = time.perf_counter() - t1, cpu_seconds(proc.pid) - c1
        rss_after = rss_bytes(proc.pid)
    row = {pid: i for i, pid in enumerate(ids)}
    removed = np.array([row[r.id] for r in out.remove], dtype=np.int64)
    found = int(planted[removed].sum()) if len(removed) else 0
    return {"items": items, "dim": DIM, "planted": int(planted.sum()), "threshold": threshold, "nprobe": nprobe,
            "removable": int(target.sum()), "removed": len(removed), "planted_found": found,
            "recall": round(found / max(1, int(planted.sum())), 4), "false_removals": len(removed) - found,
            "http_seconds": round(scan_s, 2), "retriever_cpu_seconds": round(scan_cpu, 1),
            "service_seconds": out.seconds, "method": out.method,
            "nlist": out.nlist, "load_seconds": round(load_s, 1),
            "retriever_rss_gib": {"before": round((rss_before or 0) / 2**30, 2),
                                  "after": round((rss_after or 0) / 2**30, 2)}}


def run_compaction_benchmark(out_dir: Path, *, items: int, share: float, threshold: float, nprobe: int) -> dict[
        str, Any]:
    with tempfile.TemporaryDirectory(prefix="t3ar-bench-compact-") as tmp:
        res = run(items, share, threshold, nprobe, Path(tmp))
    res["environment"] = {"when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "cpus": os.cpu_count(),
                          "machine": platform.machine(), "load_at_start": os.getloadavg()[0]}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "compaction.json").write_text(json.dumps(res, indent=2) + "\n")
    (out_dir / "compaction.md").write_text(report(res))
    return res


def report(r: dict[str, Any]) -> str:
    s = r["service_seconds"]
    return "\n".join([
        "# Pool compaction: the near-duplicate scan at scale",
        "",
        f"`t3ar bench compaction` ({r['environment']['when']}, {r['environment']['cpus']} CPUs, "
        f"load {r['environment']['load_at_start']:.1f} at the start). A vectors-only retriever holding "
        f"{r['items']:,} synthetic {r['dim']}-d vectors (the retrieval benchmark's structured generator), half "
        f"`clipart`, half `target:bench` with {r['planted']:,} planted near-duplicates (cosine ~0.995), asked "
        f"`POST /pool/near-duplicates` with `sources: [\"target:*\"]`, threshold {r['threshold']}.",
        "",
        "| what | value |",
        "|---|---|",
        f"| scan over HTTP (wall) | {r['http_seconds']} s |",
        f"| the retriever's CPU time for it (user + system, all threads) | {r['retriever_cpu_seconds']} s |",
        f"| of which: read the snapshot / build the index / range search | {s.get('read')} / {s.get('index')} / "
        f"{s.get('search')} s |",
        f"| index | {r['method']} (nlist {r['nlist']}, nprobe {r['nprobe']}) |",
        f"| removable items scanned | {r['removable']:,} |",
        f"| planted near-duplicates found | {r['planted_found']:,} of {r['planted']:,} (recall {r['recall']}) |",
        f"| removals not planted | {r['false_removals']} |",
        f"| retriever resident memory before / after | {r['retriever_rss_gib']['before']} / "
        f"{r['retriever_rss_gib']['after']} GiB |",
        f"| loading the pool (POST /pool/vectors) | {r['load_seconds']} s |",
        "",
        "The scan never compares all pairs: above 20k items every removable item asks an IVF index (about sqrt(N) "
        "cells, trained on a sample) for its neighbours at or above the threshold in `nprobe` cells. It is "
        "approximate: a pair split across cells not probed is kept, never wrongly removed.",
        "",
    ])

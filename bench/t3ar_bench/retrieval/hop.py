"""What the thread hop around a scan costs, in one process and without HTTP (a diagnostic, not part of the run).

The retriever scans a pool of more than a few thousand vectors on a thread-pool thread, so a single query pays
one hop there and back on top of the scan. This times that hop as the service takes it (``run_in_executor``
from an event loop; the scan in faiss, one OpenMP thread) for pools of growing size: how long the worker thread
takes to start after the loop hands it the scan, and how long the loop takes to resume after the scan ends.
Both threads sleep while the scan runs, so the longer the scan, the longer their wake-ups (see the retrieval
report's reading of the single-query figures).

    python -m t3ar_bench.retrieval.hop [--uvloop] [--queries N]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import faiss
import numpy as np

SIZES = (500, 2_000, 5_000, 12_500, 25_000, 50_000, 100_000)
DIM, K = 512, 50


def _scan(index: Any, q: np.ndarray) -> tuple[float, float]:
    faiss.omp_set_num_threads(1)  # per calling thread, as in the service
    t = time.perf_counter()
    index.search(q[None], K)
    return t, time.perf_counter()


async def _time_hops(index: Any, queries: np.ndarray, pool: ThreadPoolExecutor) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(pool, _scan, index, queries[0])  # the thread exists before timing
    start, back, scan = [], [], []
    for q in queries:
        t0 = time.perf_counter()
        a, b = await loop.run_in_executor(pool, _scan, index, q)
        t1 = time.perf_counter()
        start.append(a - t0)
        scan.append(b - a)
        back.append(t1 - b)
    return {"scan_ms": float(np.median(scan)) * 1e3, "start_us": float(np.median(start)) * 1e6,
            "back_us": float(np.median(back)) * 1e6}


def measure(sizes: tuple[int, ...] = SIZES, n_queries: int = 120, seed: int = 0) -> list[dict[str, float]]:
    """Median scan time and hop halves per pool size (seeded Gaussian vectors, ``n_queries`` single queries)."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((max(sizes), DIM)).astype(np.float32)
    queries = rng.standard_normal((n_queries, DIM)).astype(np.float32)
    rows = []
    with ThreadPoolExecutor(1) as pool:
        for n in sizes:
            index = faiss.IndexFlatIP(DIM)
            index.add(base[:n])
            rows.append({"vectors": n, **asyncio.run(_time_hops(index, queries, pool))})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--uvloop", action="store_true", help="run the event loop on uvloop (as the service does)")
    ap.add_argument("--queries", type=int, default=120)
    args = ap.parse_args()
    if args.uvloop:
        import uvloop

        uvloop.install()
    print("| vectors | scan p50 | thread start p50 | loop back p50 |\n|---|---|---|---|")
    for r in measure(n_queries=args.queries):
        print(f"| {r['vectors']:,} | {r['scan_ms']:.3f} ms | {r['start_us']:.0f} us | {r['back_us']:.0f} us |")


if __name__ == "__main__":
    main()

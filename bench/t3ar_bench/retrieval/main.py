"""Retriever benchmark: the HTTP service against the in-process baselines, measured side by side in one run.

1. Search over the same 100k vectors (512-d synthetic unit vectors, k=50): QPS at batch 256 over HTTP vs
   faiss ``IndexIDMap2(IndexFlatIP)`` in this process (goal >= 0.9), and single-query p50/p99 overhead
   (goal <= 2 ms).
2. Ingest: images/s through ``POST /pool`` (decode, embed, near-duplicate check, fsynced blob + SQLite commit,
   index add) vs the bare embedder forward on already decoded tensors (goal >= 0.85).
3. At 1M vectors (512-d synthetic unit vectors, loaded through the admin bulk-vector endpoint, because
   embedding 1M images is out of reach on 2 CPU cores): delete latency and visibility (goal <= 50 ms, at once),
   single-query search p50/p99, resident memory of the service vs the raw vector bytes (goal <= 1.3x).
4. ``ann``: IVF recall@50 against exact search and single-query latency at 1M vectors, structured and uniform
   data, over nprobe (goal recall >= 0.95 at p50 <= 10 ms), and exact search on a GPU when there is one
   (:mod:`t3ar_bench.retrieval.ann`).

Services run as real uvicorn subprocesses on 127.0.0.1; nothing runs concurrently with a measurement.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from t3ar.clients.retriever import RetrieverClient
from t3ar_bench.retrieval.ann import bench_ann
from t3ar_bench.retrieval.backends import SERVER_KEY, keep_server_column, server_column
from t3ar_bench.retrieval.service import (
    BATCH,
    DIM,
    K,
    cpu_seconds,
    percentiles,
    retriever_service,
    rss_bytes,
    shapes_png,
    unit_vectors,
)

log = logging.getLogger(__name__)
WARMUP_BATCHES = 3


def _load_vectors(client: RetrieverClient, n: int, chunk: int = 50_000) -> float:
    """Bulk-load n synthetic vectors (seeded chunk by chunk); returns vectors/s."""
    t0 = time.perf_counter()
    for start in range(0, n, chunk):
        client.add_vectors(unit_vectors(min(chunk, n - start), seed=1000 + start // chunk), identity="synthetic")
    return n / (time.perf_counter() - t0)


def _bench_search(work: Path, n: int, n_batches: int, n_single: int, rounds: int) -> dict[str, Any]:
    import faiss

    from t3ar.local_pool import build_flat_index

    vecs = np.concatenate([unit_vectors(min(50_000, n - s), seed=1000 + s // 50_000) for s in range(0, n, 50_000)])
    local = build_flat_index(vecs, np.arange(1, n + 1))
    queries = unit_vectors(BATCH * n_batches + n_single, seed=7)
    env = {"T3AR_RETRIEVER_EMBEDDER": "none", "T3AR_RETRIEVER_VECTOR_DIM": str(DIM),
           "T3AR_RETRIEVER_VECTOR_IDENTITY": "synthetic"}
    with retriever_service(work / "search", env) as (client, proc):
        load_rate = _load_vectors(client, n)
        batches = [queries[i * BATCH:(i + 1) * BATCH] for i in range(n_batches)]
        # The baseline uses the service's thread policy: all cores for a batch, one thread for a single query.
        faiss.omp_set_num_threads(os.cpu_count() or 1)
        local.search(batches[0], K), client.search(batches[0], K)  # warm-up
        sum_faiss = sum_http = cpu_faiss = cpu_http = 0.0
        for i, b in enumerate(batches * rounds):  # interleaved (alternating order): both see the same load
            for side in ((0, 1) if i % 2 else (1, 0)):
                if side == 0:
                    t, c = time.perf_counter(), time.process_time()
                    local.search(b, K)
                    sum_faiss += time.perf_counter() - t
                    cpu_faiss += time.process_time() - c
                else:
                    c = cpu_seconds(proc.pid)  # before the clock starts: reading /proc takes ~0.03-0.1 ms
                    t = time.perf_counter()
                    res = client.search(b, K)
                    sum_http += time.perf_counter() - t
                    cpu_http += cpu_seconds(proc.pid) - c
        faiss_qps = BATCH * n_batches * rounds / sum_faiss
        http_qps = BATCH * n_batches * rounds / sum_http
        assert len(res.ids) == BATCH and len(res.ids[0]) == K
        singles = queries[BATCH * n_batches:]
        faiss.omp_set_num_threads(1)
        t_local, t_http = [], []
        c_local = c_http = c_client = 0.0
        for q in singles:  # interleaved, so both see the same machine state
            t, c = time.perf_counter(), time.process_time()
            local.search(q[None], K)
            t_local.append(time.perf_counter() - t)
            c_local += time.process_time() - c
            cs = cpu_seconds(proc.pid)  # before the clocks start (not part of the round trip)
            t, c = time.perf_counter(), time.process_time()
            client.search(q[None], K)
            t_http.append(time.perf_counter() - t)
            c_client += time.process_time() - c
            c_http += cpu_seconds(proc.pid) - cs
    lp, hp = percentiles(t_local), percentiles(t_http)
    return {"vectors": n, "dim": DIM, "k": K, "batch": BATCH, "bulk_load_vectors_per_s": load_rate,
            "faiss_qps": faiss_qps, "http_qps": http_qps, "qps_ratio": http_qps / faiss_qps,
            "faiss_cpu_s_per_batch": cpu_faiss / (n_batches * rounds),
            "service_cpu_s_per_batch": cpu_http / (n_batches * rounds), "cpu_ratio": cpu_faiss / cpu_http,
            "single_faiss": lp, "single_http": hp,
            "single_overhead_p50_ms": hp["p50_ms"] - lp["p50_ms"],
            "single_overhead_p99_ms": hp["p99_ms"] - lp["p99_ms"], "rounds": rounds,
            "single_overhead_paired_p50_ms": float(np.median(np.subtract(t_http, t_local))) * 1000,
            "single_cpu_faiss_ms": c_local / len(singles) * 1000, "single_cpu_service_ms": c_http / len(singles) * 1000,
            "single_cpu_client_ms": c_client / len(singles) * 1000}


def forward_worker(batch: int) -> None:
    """Run in a clean process (faiss' and torch's OpenMP pools in one process slow each other down): reads a
    number of batches per stdin line, embeds that many decoded batches, prints the seconds it took."""
    import torch

    from t3ar.data.images import open_image, to_tensor_uint8
    from t3ar.embedder import Embedder, EmbedderSpec

    embedder = Embedder(EmbedderSpec())
    tensors = torch.stack([to_tensor_uint8(open_image(shapes_png(50_000 + s)), embedder.spec.image_size)
                           for s in range(4 * batch)])
    for w in range(WARMUP_BATCHES):  # oneDNN needs a few calls to reach its pace
        embedder.embed(tensors[w % 4 * batch:(w % 4 + 1) * batch], batch_size=batch)
    print("ready", flush=True)
    done = 0
    for line in sys.stdin:
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(int(line)):
            embedder.embed(tensors[done % 4 * batch:(done % 4 + 1) * batch], batch_size=batch)
            done += 1
        print(time.perf_counter() - t0, time.process_time() - c0, flush=True)


def _bench_ingest(work: Path, n: int, batch: int = 64, block: int = 2, in_flight: int = 2) -> dict[str, Any]:
    """Alternate blocks of ``block`` batches: bare forward (worker process), then HTTP ingest (two requests in
    flight, as ``t3ar pool ingest`` does), so that both see the same machine load."""
    pngs = [shapes_png(s) for s in range(n)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    worker = subprocess.Popen([sys.executable, "-c", f"from {forward_worker.__module__} import forward_worker; "
                               f"forward_worker({batch})"], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert worker.stdin is not None and worker.stdout is not None
    t_forward = t_http = cpu_forward = cpu_http = 0.0
    added = 0
    try:
        with retriever_service(work / "ingest", {"T3AR_RETRIEVER_DUPLICATE_POLICY": "keep"}) as (client, proc):
            for w in range(WARMUP_BATCHES):  # the same warm-up as the forward pass gets
                client.add_images([(f"warm{i}.png", shapes_png(10_000 + w * batch + i)) for i in range(batch)])
            assert worker.stdout.readline().strip() == "ready"
            with ThreadPoolExecutor(max_workers=in_flight) as ex:
                for first in range(0, n, block * batch):
                    starts = range(first, min(n, first + block * batch), batch)
                    worker.stdin.write(f"{len(starts)}\n")
                    worker.stdin.flush()
                    wall, cpu = (float(x) for x in worker.stdout.readline().split())
                    t_forward, cpu_forward = t_forward + wall, cpu_forward + cpu
                    t0, c0 = time.perf_counter(), cpu_seconds(proc.pid)
                    reports = list(ex.map(lambda s: client.add_images(
                        [(f"{i}.png", pngs[i]) for i in range(s, min(n, s + batch))]), starts))
                    t_http += time.perf_counter() - t0
                    cpu_http += cpu_seconds(proc.pid) - c0
                    added += sum(r.added for r in reports)
    finally:
        worker.stdin.close()
        worker.wait(timeout=60)
    n_forward = sum(len(range(f, min(n, f + block * batch), batch)) for f in range(0, n, block * batch)) * batch
    forward, ingest = n_forward / t_forward, n / t_http
    return {"images": n, "image_px": 64, "embed_px": 96, "batch": batch, "added": added,
            "bare_forward_images_per_s": forward, "http_ingest_images_per_s": ingest, "ratio": ingest / forward,
            "bare_forward_cpu_s_per_image": cpu_forward / n_forward, "service_cpu_s_per_image": cpu_http / n,
            "cpu_ratio": (cpu_forward / n_forward) / (cpu_http / n)}


def _bench_million(work: Path, n: int, n_single: int, n_deletes: int) -> dict[str, Any]:
    env = {"T3AR_RETRIEVER_EMBEDDER": "none", "T3AR_RETRIEVER_VECTOR_DIM": str(DIM),
           "T3AR_RETRIEVER_VECTOR_IDENTITY": "synthetic"}
    data = work / "million"
    out: dict[str, Any] = {"vectors": n, "dim": DIM, "raw_vector_bytes": n * DIM * 4}
    with retriever_service(data, env) as (client, proc):
        out["bulk_load_vectors_per_s"] = _load_vectors(client, n)
        out["rss_after_load_bytes"] = rss_bytes(proc.pid)
    with retriever_service(data, env) as (client, proc):  # the steady state: a fresh process loaded the saved index
        out["restart_repairs"] = client.stats().repairs
        out["rss_bytes"] = rss_bytes(proc.pid)
        queries = unit_vectors(n_single, seed=11)
        client.search(queries[:1], K)
        t_single = []
        for q in queries:
            t = time.perf_counter()
            client.search(q[None], K)
            t_single.append(time.perf_counter() - t)
        out["search_single"] = percentiles(t_single)
        t = time.perf_counter()
        client.search(unit_vectors(BATCH, seed=12), K)
        out["search_batch256_s"] = time.perf_counter() - t
        rng = np.random.default_rng(3)
        victims = [int(s) for s in rng.choice(np.arange(1, n + 1), size=n_deletes, replace=False)]
        tag = client.list_items(limit=1).items[0].id.split("-")[0]
        vectors = {}
        chunks = {s: unit_vectors(min(50_000, n - s), seed=1000 + s // 50_000) for s in
                  sorted({(v - 1) // 50_000 * 50_000 for v in victims})}
        for v in victims:
            vectors[v] = chunks[(v - 1) // 50_000 * 50_000][(v - 1) % 50_000]
        t_del, visible_after = [], 0
        for v in victims:
            pid = f"{tag}-{v}"
            assert client.search(vectors[v][None], 1).ids[0] == [pid]  # it is its own nearest neighbour
            t = time.perf_counter()
            client.delete(pid)
            t_del.append(time.perf_counter() - t)
            if pid in client.search(vectors[v][None], 10).ids[0]:
                visible_after += 1
        out["delete"] = percentiles(t_del)
        out["deleted_still_returned"] = visible_after
        time.sleep(3)  # let the compactor run, then measure single-query latency again
        t_after = []
        for q in queries[: max(5, n_single // 4)]:
            t = time.perf_counter()
            client.search(q[None], K)
            t_after.append(time.perf_counter() - t)
        out["search_single_after_deletes"] = percentiles(t_after)
        out["rss_end_bytes"] = rss_bytes(proc.pid)
    out["rss_ratio"] = (out["rss_bytes"] or 0) / out["raw_vector_bytes"]
    out["disk_bytes"] = sum(p.stat().st_size for p in data.rglob("*") if p.is_file())
    return out


def _backends_section(work: Path, n: int, quick: bool, milvus_uri: str | None, lite: bool = True) -> dict[str, Any]:
    """faiss vs milvus-lite (vs a Milvus server given by URI) (t3ar_bench.retrieval.backends); skipped with the
    reason if pymilvus is missing."""
    from t3ar_bench.retrieval.backends import bench_backends

    if importlib.util.find_spec("pymilvus") is None or importlib.util.find_spec("milvus_lite") is None:
        return {"skipped": "pymilvus / milvus-lite not installed (pip install 't3ar[milvus]')"}
    log.info("backends: faiss%s%s, %d vectors", " vs milvus-lite" if lite else "",
             f" vs the Milvus server at {milvus_uri}" if milvus_uri
             else "", n)
    return bench_backends(work, n, n_batches=2 if quick else 4, n_single=30 if quick else 100,
                          n_deletes=10 if quick else 30, milvus_server_uri=milvus_uri, lite=lite)


def code_commit() -> str:
    """The commit of the code measured (``git rev-parse HEAD`` where this package lives), ``+dirty`` when the
    checkout has uncommitted changes; ``unknown`` outside a git checkout."""
    import subprocess

    where = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=30,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where,
                               capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def run_backends_only(out_dir: Path, *, quick: bool, backends_vectors: int | None,
                      milvus_uri: str | None, lite: bool = True) -> dict[str, Any]:
    """Only the ``backends`` section, e.g. to add a Milvus server's figures without re-running the rest (the 1M
    sections take most of a full run). The last full run's results in ``out_dir`` stay as they are, its own
    backends table included; this run's table is kept next to it as ``backends_separate``, saying when and how
    it was measured (its own size, load average and command), and the report is rendered again."""
    previous = out_dir / "retrieval.json"
    results = _previous_run(previous)
    if not results.get("search"):
        raise RuntimeError(f"{previous} holds no full run: run `t3ar bench retrieval` once first")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    work = Path(tempfile.mkdtemp(prefix="t3ar-bench-retrieval-"))
    n = backends_vectors or (20_000 if quick else 100_000)
    command = "t3ar bench retrieval --only backends" + (" --quick" if quick else "") + \
        (f" --backends-vectors {backends_vectors}" if backends_vectors else "") + \
        (" --milvus-uri URI" if milvus_uri else "") + ("" if lite else " --no-milvus-lite")
    t0, load = time.time(), os.getloadavg()
    try:
        section = _backends_section(work, n, quick, milvus_uri, lite)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    code = code_commit()
    column = server_column(section, measured_at=stamp, command=command, load_average_start=load, carried_over=True,
                           commit=code)
    if column:  # the full run's table keeps the newest server column (measured apart from it: carried over)
        results["backends"][SERVER_KEY] = column
    results["backends_separate"] = {**section, "measured_at": stamp, "quick": quick, "commit": code,
                                    "command": command, "load_average_start": load,
                                    "load_average_end": os.getloadavg(), "wall_seconds": time.time() - t0}
    previous.write_text(json.dumps(results, indent=2, sort_keys=True))
    from t3ar_bench.retrieval.report import render_markdown

    (out_dir / "retrieval.md").write_text(render_markdown(results))
    return results


def headline(r: dict[str, Any]) -> dict[str, Any]:
    s, i, big = r["search"], r["ingest"], r["large"]
    return {"started_at": r["started_at"], "quick": r["quick"], "load_average_start": r.get("load_average_start"),
            "qps_ratio": s["qps_ratio"], "single_overhead_p50_ms": s["single_overhead_p50_ms"],
            "single_overhead_p99_ms": s["single_overhead_p99_ms"], "ingest_ratio": i["ratio"],
            "single_scan_p50_ms": s["single_faiss"]["p50_ms"], "delete_p99_ms": big["delete"]["p99_ms"],
            "rss_ratio": big["rss_ratio"],
            "ann_recall_at_50": (r.get("ann") or {}).get("recall_at_50"),
            "ann_single_query_p50_ms": (r.get("ann") or {}).get("single_query_p50_ms")}


def _history(previous: Path, current: dict[str, Any]) -> list[dict[str, Any]]:
    """Headline figures of the last runs written to the same place (the machine may be shared: show spread)."""
    old = _previous_run(previous)
    try:
        runs = old.get("history") or ([headline(old)] if old else [])
    except KeyError:
        runs = []
    return [*runs, headline(current)][-10:]


def _previous_run(previous: Path) -> dict[str, Any]:
    """The ``retrieval.json`` a run is about to replace, or {} when there is none or it cannot be read."""
    try:
        old = json.loads(previous.read_text())
    except (OSError, ValueError):
        return {}
    return old if isinstance(old, dict) else {}


def keep_device_figure(previous: Path, ann: dict[str, Any]) -> None:
    """A run on a machine without a GPU keeps the last measured GPU exact-search figure of ``previous`` (its
    ``retrieval.json``), marked as carried over, instead of replacing it with 'not measured'."""
    if ann.get("device", {}).get("available"):
        return
    old = (_previous_run(previous).get("ann") or {}).get("device") or {}
    if old.get("available"):
        note = old.get("note") or ""
        carried = "Carried over from an earlier run: this one had no GPU."
        ann["device"] = {**old, "note": note if carried in note else f"{note} {carried}".strip()}


def keep_real_structure(previous: Path, ann: dict[str, Any], started_at: str) -> None:
    """A run without the cached real pool embeddings (a fresh checkout that never ran `t3ar bench adapt`) keeps
    the structure of the real set last measured in ``previous``, marked with the run that measured it, instead
    of leaving the generator without the data it was matched to. A run that measures it stamps its own."""
    if ann.get("real_structure"):
        ann["real_structure"].setdefault("measured_at", started_at)
        return
    old = _previous_run(previous)
    real = (old.get("ann") or {}).get("real_structure")
    if real:
        ann["real_structure"] = {**real, "measured_at": real.get("measured_at") or old.get("started_at"),
                                 "carried_over": True}


def run_retrieval_benchmark(out_dir: Path, *, quick: bool, backends_vectors: int | None = None,
                            milvus_uri: str | None = None, lite: bool = True) -> dict[str, Any]:
    """Run everything, write ``retrieval.json`` and ``retrieval.md`` into ``out_dir``; return the results."""
    out_dir.mkdir(parents=True, exist_ok=True)
    # Every process of the run (this one's faiss, the forward worker, the services) waits passively in OpenMP,
    # like the service does by default: busy-waiting threads on a shared machine burn 3-4x the CPU per image.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    work = Path(tempfile.mkdtemp(prefix="t3ar-bench-retrieval-"))
    sizes = {"search_n": 20_000 if quick else 100_000, "batches": 2 if quick else 4, "rounds": 2 if quick else 3,
             "single": 50 if quick else 300,
             "ingest_n": 128 if quick else 640, "big_n": 100_000 if quick else 1_000_000,
             "big_single": 10 if quick else 60, "deletes": 10 if quick else 50,
             "ann_n": 100_000 if quick else 1_000_000, "ann_queries": 100 if quick else 200,
             "ann_nlist": 256 if quick else 1024,
             "backends_n": backends_vectors or (20_000 if quick else 100_000)}
    t0 = time.time()
    try:
        results: dict[str, Any] = {
            "quick": quick, "started_at": time.strftime("%Y-%m-%d %H:%M:%S"),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                        "uvicorn_extras": [m for m in ("httptools", "uvloop") if importlib.util.find_spec(m)]},
            "load_average_start": os.getloadavg(), "omp_wait_policy": os.environ["OMP_WAIT_POLICY"],
        }
        log.info("search: %d vectors", sizes["search_n"])
        results["search"] = _bench_search(work, sizes["search_n"], sizes["batches"], sizes["single"], sizes["rounds"])
        log.info("ingest: %d images", sizes["ingest_n"])
        results["ingest"] = _bench_ingest(work, sizes["ingest_n"])
        log.info("large pool: %d vectors", sizes["big_n"])
        results["large"] = _bench_million(work, sizes["big_n"], sizes["big_single"], sizes["deletes"])
        log.info("ann: %d vectors", sizes["ann_n"])
        results["ann"] = bench_ann(sizes["ann_n"], sizes["ann_queries"], sizes["ann_queries"], sizes["ann_nlist"])
        if not quick:  # a quick run's figures are at another size: nothing to carry
            keep_device_figure(out_dir / "retrieval.json", results["ann"])
            keep_real_structure(out_dir / "retrieval.json", results["ann"], results["started_at"])
        results["backends"] = _backends_section(work, sizes["backends_n"], quick, milvus_uri, lite)
        command = "t3ar bench retrieval" + (" --quick" if quick else "") + \
            (f" --backends-vectors {backends_vectors}" if backends_vectors else "") + \
            (" --milvus-uri URI" if milvus_uri else "") + ("" if lite else " --no-milvus-lite")
        keep_server_column(results["backends"], _previous_run(out_dir / "retrieval.json"),
                           measured_at=results["started_at"], command=command)
        results["wall_seconds"] = time.time() - t0
        results["load_average_end"] = os.getloadavg()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["history"] = _history(out_dir / "retrieval.json", results)
    (out_dir / "retrieval.json").write_text(json.dumps(results, indent=2, sort_keys=True))
    from t3ar_bench.retrieval.report import render_markdown

    (out_dir / "retrieval.md").write_text(render_markdown(results))
    return results


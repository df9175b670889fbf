"""``t3ar bench pool``: the compressed index (``ivfpq``) at pool scale, through a real retriever process over HTTP.

What one run measures, at ``--vectors`` N (the goal: 10 M on one 24 GiB machine):

- **data**: the structured generator of the 1 M benchmark (:func:`~t3ar_bench.retrieval.ann.mixture_vectors`,
  512-d unit vectors with the neighbourhood structure of real embeddings), generated chunk by chunk (never the
  whole set in memory); queries are held-out samples of the same distribution;
- **ingest**: every chunk through ``POST /pool/vectors`` (vectors/s over the whole load, background training
  included: the pool starts on an exact index and the retriever trains IVF-PQ off to the side as it grows);
- **ground truth**: the exact top-50 of each recall query, merged chunk by chunk while the chunks are generated;
- **search**: single-query p50 over HTTP (one query per request, k = 50) and recall@50 of those answers;
- **memory / disk**: the retriever's resident memory (``VmRSS``; ``RssAnon``, the process's own memory, and
  ``RssFile``, mapped file pages the kernel may drop, beside it) and the data directory's allocated bytes;
- **deletes**: ids deleted one by one, each searched for by its own vector right after its 2xx (and again after a
  restart): how many come back;
- **cold start**: SIGTERM (the index is saved), then the time from a new process's start to ready, which must
  load the saved index (no repair) rather than retrain;
- **real embeddings** (a sanity set, :mod:`~t3ar_bench.retrieval.pool_real`): with ``--real-embeddings``, the same
  index built in-process over real embeddings, recall@50 against exact search.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from t3ar.clients.retriever import RetrieverClient
from t3ar.clients.retriever_errors import RetrieverUnavailableError
from t3ar.clients.retriever_models import StatsResponse
from t3ar_bench.retrieval.ann import K, mixture_vectors
from t3ar_bench.retrieval.service import percentiles, retriever_service, rss_bytes

log = logging.getLogger(__name__)
DIM = 512
CHUNK = 50_000  # vectors per POST /pool/vectors (100 MiB of float32 on the wire)
QUERY_SEED, BASE_SEED = 7, 1000


def default_nlist(n: int) -> int:
    """About sqrt(n) lists, a power of two (4096 at 10 M, 512 at 200 k), at least 64."""
    return max(64, 2 ** round(math.log2(max(n, 1) ** 0.5)))


def proc_memory(pid: int) -> dict[str, int | None]:
    """VmRSS, RssAnon, RssFile and VmHWM (the peak resident memory since the process started) in bytes (Linux
    /proc)."""
    out: dict[str, int | None] = {"rss_bytes": rss_bytes(pid), "rss_anon_bytes": None, "rss_file_bytes": None,
                                  "peak_rss_bytes": None}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            for key, name in (("RssAnon:", "rss_anon_bytes"), ("RssFile:", "rss_file_bytes"),
                              ("VmHWM:", "peak_rss_bytes")):
                if line.startswith(key):
                    out[name] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def disk_bytes(root: Path) -> int:
    """Bytes allocated on disk under ``root`` (sparse files count what they use)."""
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())


class TopK:
    """The exact top-k of fixed queries over a set seen chunk by chunk."""

    def __init__(self, queries: np.ndarray, k: int) -> None:
        self.q, self.k = queries, k
        self.scores = np.full((len(queries), k), -np.inf, np.float32)
        self.ids = np.full((len(queries), k), -1, np.int64)

    def add(self, first_seq: int, chunk: np.ndarray) -> None:
        s = self.q @ chunk.T
        ids = np.broadcast_to(np.arange(first_seq, first_seq + len(chunk)), s.shape)
        all_s, all_i = np.concatenate([self.scores, s], 1), np.concatenate([self.ids, ids], 1)
        top = np.argpartition(-all_s, self.k - 1, axis=1)[:, :self.k]
        self.scores, self.ids = np.take_along_axis(all_s, top, 1), np.take_along_axis(all_i, top, 1)


def recall(found: list[list[int]], truth: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(t.tolist())) / truth.shape[1] for f, t in zip(found, truth, strict=True)]))


def _env(dim: int, identity: str, nlist: int, nprobe: int, pq_m: int, rerank: int, train_min: int) -> dict[str, str]:
    return {"T3AR_RETRIEVER_EMBEDDER": "none", "T3AR_RETRIEVER_VECTOR_DIM": str(dim),
            "T3AR_RETRIEVER_VECTOR_IDENTITY": identity, "T3AR_RETRIEVER_INDEX_TYPE": "ivfpq",
            "T3AR_RETRIEVER_IVF_NLIST": str(nlist), "T3AR_RETRIEVER_IVF_NPROBE": str(nprobe),
            "T3AR_RETRIEVER_PQ_M": str(pq_m), "T3AR_RETRIEVER_RERANK_FACTOR": str(rerank),
            "T3AR_RETRIEVER_IVF_TRAIN_MIN": str(train_min), "T3AR_RETRIEVER_MAX_VECTORS_PER_REQUEST": str(CHUNK),
            # the flat cap is checked for count plus batch: it must take at least two chunks
            "T3AR_RETRIEVER_IVF_FLAT_MAX": str(max(2 * train_min, 2 * CHUNK))}


def _wait_trained(client: RetrieverClient, timeout: float) -> StatsResponse:
    """Until the index is IVF-PQ and no retrain is due (the pool is under twice what it was trained on)."""
    deadline = time.monotonic() + timeout
    while True:
        idx = (st := client.stats()).index
        if idx.type == "ivfpq" and st.count < 2 * (idx.trained_on or 0):
            return st
        if time.monotonic() > deadline:
            raise RuntimeError(f"the index was not trained within {timeout:.0f}s: {idx}")
        time.sleep(1.0)


def read_through(path: Path, block: int = 64 << 20) -> float:
    """Read a file once from start to end (into the kernel's page cache: the float16 rows each search re-ranks
    from, as on a host that has served the pool a while; it fits beside the process on the 24 GiB machine);
    the seconds it took."""
    t = time.perf_counter()
    with path.open("rb", buffering=0) as f:
        while f.read(block):
            pass
    return time.perf_counter() - t


def _add(client: Any, chunk: np.ndarray, timeout: float) -> tuple[list[str], float]:
    """``POST /pool/vectors`` of one chunk, waiting out the retriever's backpressure: while the pool is still on
    its exact index and at its cap (``T3AR_RETRIEVER_IVF_FLAT_MAX``), adds answer 503 until the first training
    is in, and the client's own retries may not cover a long training. The ids and the seconds spent held."""
    deadline, held = time.monotonic() + timeout, 0.0
    while True:
        t = time.perf_counter()
        try:
            return client.add_vectors(chunk, identity="synthetic-mixture"), held
        except RetrieverUnavailableError as e:
            if time.monotonic() > deadline:
                raise
            held += time.perf_counter() - t
            log.info("adds held back (%s); waiting", str(e)[:160])
            time.sleep(5.0)
            held += 5.0


def _searches(client: Any, queries: np.ndarray) -> tuple[list[list[int]], list[float]]:
    found, seconds = [], []
    client.search(queries[:1], K)  # warm-up
    for q in queries:
        t = time.perf_counter()
        ids = client.search(q[None], K).ids[0]
        seconds.append(time.perf_counter() - t)
        found.append([int(i.rsplit("-", 1)[1]) for i in ids])
    return found, seconds


def bench_pool(work: Path, n: int, *, n_queries: int = 200, n_deletes: int = 200, nlist: int | None = None,
               nprobe: int = 32, pq_m: int = 64, rerank: int = 4) -> dict[str, Any]:
    nlist = nlist or default_nlist(n)
    train_min = min(max(n // 4, 1000), 500_000)
    env = _env(DIM, "synthetic-mixture", nlist, nprobe, pq_m, rerank, train_min)
    data = work / "pool"
    out: dict[str, Any] = {"vectors": n, "dim": DIM, "k": K, "data": "structured (ann.mixture_vectors)",
                           "index": {"type": "ivfpq", "nlist": nlist, "nprobe": nprobe, "pq_m": pq_m,
                                     "rerank_factor": rerank, "train_min": train_min},
                           "raw_float32_bytes": n * DIM * 4}
    queries = mixture_vectors(n_queries, seed=QUERY_SEED)
    truth = TopK(queries, K)
    rng = np.random.default_rng(3)
    victims = np.sort(rng.choice(np.arange(1, n + 1), size=min(n_deletes, n // 2), replace=False))
    victim_vecs: dict[int, np.ndarray] = {}
    with retriever_service(data, env) as (client, proc):
        out["memory_empty"] = proc_memory(proc.pid)  # the process before the pool holds anything
        t0, t_post, held = time.perf_counter(), 0.0, 0.0
        for start in range(0, n, CHUNK):
            chunk = mixture_vectors(min(CHUNK, n - start), seed=BASE_SEED + start // CHUNK)
            t = time.perf_counter()
            ids, wait = _add(client, chunk, timeout=max(3600.0, n / 500))
            t_post += time.perf_counter() - t
            held += wait
            seqs = np.array([int(i.rsplit("-", 1)[1]) for i in ids])
            if not (seqs == np.arange(start + 1, start + len(chunk) + 1)).all():
                raise RuntimeError("the pool was not empty: ids do not follow the load order")
            truth.add(start + 1, chunk)
            for v in victims[(victims > start) & (victims <= start + len(chunk))]:
                victim_vecs[int(v)] = chunk[int(v) - start - 1].copy()
            if (start // CHUNK) % 20 == 0:
                log.info("ingested %d/%d vectors (%.0f/s)", start + len(chunk), n,
                         (start + len(chunk)) / (time.perf_counter() - t0))
        out["ingest_vectors_per_s"] = n / t_post
        out["ingest_wall_s"] = time.perf_counter() - t0
        out["ingest_held_s"] = held  # in 503s of the flat cap, after the client's own retries (in t_post)
        out["adds_held_in_retriever_s"] = client.stats().index.adds_held_s  # waits inside the POSTs
        out["memory_after_ingest"] = proc_memory(proc.pid)
        t = time.perf_counter()
        st = _wait_trained(client, timeout=max(600.0, n / 2000))
        out["train_wait_after_ingest_s"] = time.perf_counter() - t
        out["trained_on"] = st.index.trained_on
        found, seconds = _searches(client, queries)  # as the ingest left the page cache (rows maybe not in it)
        out["single_as_ingested"] = percentiles(seconds)
        out["recall_at_50_as_ingested"] = recall(found, truth.ids)
        out["row_file_read_s"] = read_through(data / "vectors.f16")
        load_before = os.getloadavg()[0]
        found, seconds = _searches(client, queries)  # the rows in the page cache: a host serving the pool a while
        out["single"] = percentiles(seconds)
        out["load_average_during_search"] = (load_before + os.getloadavg()[0]) / 2  # latency is CPU-bound
        out["recall_at_50"] = recall(found, truth.ids)
        out.update(proc_memory(proc.pid))
        tag = client.list_items(limit=1).items[0].id.split("-")[0]
        t_del, returned = [], 0
        for v in victims.tolist():
            pid = f"{tag}-{v}"
            t = time.perf_counter()
            client.delete(pid)
            t_del.append(time.perf_counter() - t)
            returned += pid in client.search(victim_vecs[v][None], K).ids[0]
        out["delete"] = percentiles(t_del)
        out["deletes"] = len(victims)
        out["deleted_returned_after_2xx"] = returned
        out["memory_after_deletes"] = proc_memory(proc.pid)
    out["disk_bytes"] = disk_bytes(data)
    out["disk_breakdown"] = {p.name: p.stat().st_blocks * 512 for p in sorted(data.rglob("*"))
                             if p.is_file() and p.stat().st_blocks * 512 > 1 << 20}
    t = time.perf_counter()
    with retriever_service(data, env) as (client, proc):  # cold start: the saved index, never a retrain
        out["cold_start_s"] = time.perf_counter() - t
        st = client.stats()
        out["cold_start_repairs"] = st.repairs
        out["cold_start_index"] = st.index.model_dump(mode="json")
        gone = [f"{tag}-{v}" for v in victims.tolist()]
        res = client.search(np.stack([victim_vecs[v] for v in victims.tolist()]), K).ids
        out["deleted_returned_after_restart"] = sum(g in row for g, row in zip(gone, res, strict=True))
        found, seconds = _searches(client, queries[: max(20, n_queries // 4)])
        out["single_after_restart"] = percentiles(seconds)
        out["memory_after_restart"] = mem = proc_memory(proc.pid)
        if mem["rss_anon_bytes"] is not None and out["memory_empty"]["rss_anon_bytes"] is not None:
            out["anon_bytes_per_vector"] = (mem["rss_anon_bytes"] - out["memory_empty"]["rss_anon_bytes"]) / n
    out["deleted_still_returned"] = out["deleted_returned_after_2xx"] + out["deleted_returned_after_restart"]
    return out


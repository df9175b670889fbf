"""The ``backends`` section of ``t3ar bench retrieval``: the retriever's two pool backends side by side (issue 12).

Two real retriever processes on 127.0.0.1, one with ``T3AR_RETRIEVER_BACKEND=faiss`` (in-process index) and
one with ``milvus`` (milvus-lite in the data directory), both vectors-only and loaded with the same synthetic
512-d unit vectors through ``POST /pool/vectors``. Measured over HTTP with ``RetrieverClient``, alternating
between the two services so that both see the same machine load: bulk ingest rate (vectors/s, including
the SQLite commit both backends share), batch QPS (256 queries, k = 50), single-query latency, and deletes
(``DELETE /pool/{id}`` latency, then a search for the deleted vector itself: how many deleted ids are
returned after the 2xx, which must be 0 on both).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)
BACKEND_NAMES = ("faiss", "milvus")


def bench_backends(work: Path, n: int, *, n_batches: int, n_single: int, n_deletes: int) -> dict[str, Any]:
    """Both backends on the same ``n`` vectors; returns ``{"vectors", ..., "faiss": {...}, "milvus": {...}}``."""
    from contextlib import ExitStack

    from t3ar.bench.retrieval.main import BATCH, DIM, K, _pcts, _service, _unit_vectors

    chunk = 50_000
    env = {"T3AR_RETRIEVER_EMBEDDER": "none", "T3AR_RETRIEVER_VECTOR_DIM": str(DIM),
           "T3AR_RETRIEVER_VECTOR_IDENTITY": "synthetic"}
    out: dict[str, Any] = {"vectors": n, "dim": DIM, "k": K, "batch": BATCH,
                           "milvus_uri": "milvus-lite (a file in the data directory)"}
    with ExitStack() as stack:
        clients = {}
        for name in BACKEND_NAMES:
            t0 = time.perf_counter()
            client, _ = stack.enter_context(_service(work / f"backend-{name}", {**env, "T3AR_RETRIEVER_BACKEND": name}))
            out[name] = {"start_s": time.perf_counter() - t0}
            clients[name] = client
        for name, client in clients.items():  # ingest one after the other (each uses the cores it can get)
            log.info("backends: loading %d vectors into %s", n, name)
            t0 = time.perf_counter()
            for start in range(0, n, chunk):
                client.add_vectors(_unit_vectors(min(chunk, n - start), seed=1000 + start // chunk),
                                   identity="synthetic")
            out[name]["ingest_vectors_per_s"] = n / (time.perf_counter() - t0)
            assert client.stats()["count"] == n
        queries = _unit_vectors(BATCH * n_batches + n_single, seed=21)
        batches = [queries[i * BATCH:(i + 1) * BATCH] for i in range(n_batches)]
        for client in clients.values():
            client.search(batches[0], K)  # warm-up
        spent = dict.fromkeys(BACKEND_NAMES, 0.0)
        same_top1 = 0
        for i, b in enumerate(batches):  # alternating order: both see the same load
            got = {}
            for name in (BACKEND_NAMES if i % 2 else BACKEND_NAMES[::-1]):
                t = time.perf_counter()
                got[name] = clients[name].search(b, K)
                spent[name] += time.perf_counter() - t
            same_top1 += sum(x[0].split("-")[1] == y[0].split("-")[1]  # the same seq (each pool has its own tag)
                             for x, y in zip(got["faiss"].ids, got["milvus"].ids, strict=True))
        singles = dict.fromkeys(BACKEND_NAMES)
        times: dict[str, list[float]] = {name: [] for name in BACKEND_NAMES}
        for j, q in enumerate(queries[BATCH * n_batches:]):
            for name in (BACKEND_NAMES if j % 2 else BACKEND_NAMES[::-1]):
                t = time.perf_counter()
                clients[name].search(q[None], K)
                times[name].append(time.perf_counter() - t)
        for name in BACKEND_NAMES:
            out[name]["qps"] = BATCH * n_batches / spent[name]
            singles[name] = out[name]["single"] = _pcts(times[name])
        out["same_top1_share"] = same_top1 / (BATCH * n_batches)  # both are exact: ids agree up to ties
        rng = np.random.default_rng(5)
        victims = sorted(int(s) for s in rng.choice(np.arange(1, n + 1), size=n_deletes, replace=False))
        chunks = {s: _unit_vectors(min(chunk, n - s), seed=1000 + s // chunk)
                  for s in sorted({(v - 1) // chunk * chunk for v in victims})}
        vec = {v: chunks[(v - 1) // chunk * chunk][(v - 1) % chunk] for v in victims}
        for name, client in clients.items():
            tag = client.list_items(limit=1)["items"][0]["id"].split("-")[0]
            t_del, returned = [], 0
            for v in victims:
                pid = f"{tag}-{v}"
                assert client.search(vec[v][None], 1).ids[0] == [pid]  # its own nearest neighbour before
                t = time.perf_counter()
                client.delete(pid)
                t_del.append(time.perf_counter() - t)
                returned += pid in client.search(vec[v][None], 10).ids[0]
            out[name]["delete"] = _pcts(t_del)
            out[name]["deleted_returned_after_2xx"] = returned
    return out


def backends_markdown(b: dict[str, Any]) -> list[str]:
    """The section's lines for retrieval.md."""
    f, m = b["faiss"], b["milvus"]
    zero = f["deleted_returned_after_2xx"] == 0 and m["deleted_returned_after_2xx"] == 0
    return [
        f"## Pool backends: faiss vs milvus-lite, {b['vectors']:,} vectors, {b['dim']}-d, k = {b['k']}",
        "",
        "Two retriever processes, `T3AR_RETRIEVER_BACKEND=faiss` (the index in the retriever) and `milvus` "
        f"({b['milvus_uri']}, FLAT inner product, Strong consistency on every search), loaded with the same "
        "synthetic vectors through `POST /pool/vectors` (both also commit them to SQLite, the pool's source of "
        "truth), then measured over HTTP alternately. Deletes: `DELETE /pool/{id}` of a vector, then a search for "
        "that vector itself.",
        "",
        "| | faiss | milvus-lite |",
        "|---|---|---|",
        f"| service start (empty pool) | {f['start_s']:.1f} s | {m['start_s']:.1f} s |",
        f"| ingest, vectors/s | {f['ingest_vectors_per_s']:,.0f} | {m['ingest_vectors_per_s']:,.0f} |",
        f"| search QPS, batches of {b['batch']} | {f['qps']:,.0f} | {m['qps']:,.0f} |",
        f"| one query, p50 / p99 | {f['single']['p50_ms']:.1f} / {f['single']['p99_ms']:.1f} ms | "
        f"{m['single']['p50_ms']:.1f} / {m['single']['p99_ms']:.1f} ms |",
        f"| `DELETE`, p50 / p99 (n = {f['delete']['n']}) | {f['delete']['p50_ms']:.1f} / "
        f"{f['delete']['p99_ms']:.1f} ms | {m['delete']['p50_ms']:.1f} / {m['delete']['p99_ms']:.1f} ms |",
        f"| deleted ids returned after the 2xx (goal 0) | {f['deleted_returned_after_2xx']} | "
        f"{m['deleted_returned_after_2xx']} |",
        "",
        f"Goal (deleted ids returned = 0 on both): {'met' if zero else '**missed**'}. Top-1 ids agree on "
        f"{b['same_top1_share']:.1%} of the batch queries (both searches are exact; ties may order differently).",
        "",
    ]

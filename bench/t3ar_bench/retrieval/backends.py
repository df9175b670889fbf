"""The ``backends`` section of ``t3ar bench retrieval``: the retriever's pool backends side by side.

Real retriever processes on 127.0.0.1, one with ``T3AR_RETRIEVER_BACKEND=faiss`` (the in-process index, IVF:
``T3AR_RETRIEVER_INDEX_TYPE=ivf``, trained in the background once the pool is loaded; the run waits for it), one
with ``milvus`` (milvus-lite in the data directory; left out with ``lite=False``) and, when a Milvus server's URI
is given (``--milvus-uri``), one with ``milvus`` on that server (``milvus_server``; the benchmark does not start a
server, it measures the one it is given). Both Milvus backends use the retriever's defaults (an HNSW index,
Session consistency, every answer filtered against the pool's database) unless ``T3AR_RETRIEVER_MILVUS_*`` in the
environment says otherwise. All vectors-only and loaded with the same
vectors through ``POST /pool/vectors``: samples of the structured generator of the ``ann`` section
(:func:`~t3ar_bench.retrieval.ann.mixture_vectors`: the neighbourhood structure of real embeddings, which is what
an ANN index's recall depends on). On the server the run then seals the collection's segments (``flush``) and
waits until Milvus indexed every row, as Milvus does by itself once a segment is full or idle: what is measured is
the indexed collection, not rows still in growing segments.

Measured over HTTP with ``RetrieverClient``, alternating between the services so that all see the same machine
load: bulk ingest rate (vectors/s, including the SQLite commit every backend shares), batch QPS (256 queries,
k = 50), single-query latency and recall@k of those single queries against the exact top k (numpy over the same
vectors), and deletes (``DELETE /pool/{id}`` latency, then a search for the deleted vector itself: how many deleted
ids are returned after the 2xx, which must be 0 on all).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)
BACKEND_NAMES = ("faiss", "milvus")
SERVER_KEY = "milvus-server"  # backends[SERVER_KEY]: the last real server measured, kept by later runs
NO_SERVER = "no Milvus server was given (`t3ar bench retrieval --milvus-uri http://HOST:19530`)"


def server_version(uri: str) -> str:
    """The Milvus server's version string (e.g. ``v2.3.5-lite``), or why it could not be read."""
    try:
        from pymilvus import MilvusClient

        client = MilvusClient(uri=uri, timeout=30)
        try:
            return str(client.get_server_version())
        finally:
            client.close()
    except Exception as e:  # reported, not raised: the retriever's own start-up says what is wrong
        return f"unknown ({type(e).__name__}: {e})"


CHUNK = 50_000  # vectors per POST /pool/vectors; chunk i holds the generator's samples of seed 1000 + i


def _chunk(start: int, n: int) -> np.ndarray:
    from t3ar_bench.retrieval.ann import mixture_vectors

    return mixture_vectors(min(CHUNK, n - start), seed=1000 + start // CHUNK)


def exact_top_k(chunks: dict[int, np.ndarray], queries: np.ndarray, k: int) -> np.ndarray:
    """The exact top-``k`` seqs (1-based, the pool's ids in load order) of each query, by inner product over the
    chunks (``{start: vectors}``), one chunk at a time."""
    best_s = np.full((len(queries), 0), -np.inf, dtype=np.float32)
    best_i = np.zeros((len(queries), 0), dtype=np.int64)
    for start, vecs in sorted(chunks.items()):
        s = queries @ vecs.T
        i = np.broadcast_to(np.arange(start + 1, start + 1 + len(vecs)), s.shape)
        s, i = np.concatenate([best_s, s], axis=1), np.concatenate([best_i, i], axis=1)
        top = np.argsort(-s, axis=1)[:, :k]
        best_s, best_i = np.take_along_axis(s, top, axis=1), np.take_along_axis(i, top, axis=1)
    return best_i


def wait_server_indexed(uri: str, collection: str, n: int, timeout: float = 3600) -> float:
    """Seal a Milvus server collection's segments and wait until its index covers ``n`` rows; the seconds it
    took."""
    from pymilvus import MilvusClient

    t0 = time.perf_counter()
    client = MilvusClient(uri=uri, timeout=600)
    try:
        client.flush(collection)
        name = client.list_indexes(collection, field_name="vector")[0]
        while time.perf_counter() - t0 < timeout:
            info = client.describe_index(collection, name)
            if int(info.get("indexed_rows", 0)) >= n and not int(info.get("pending_index_rows", 0)):
                break
            time.sleep(2)
        else:
            raise RuntimeError(f"the Milvus server did not index {collection} within {timeout:.0f} s: {info}")
    finally:
        client.close()
    return time.perf_counter() - t0


def _wait_ivf(client: Any, timeout: float = 3600) -> float:
    """Wait until the faiss retriever's background training swapped its IVF index in; the seconds it took."""
    t0 = time.perf_counter()
    while client.stats().index.type != "ivf":
        if time.perf_counter() - t0 > timeout:
            raise RuntimeError("the faiss retriever did not train its IVF index in time")
        time.sleep(1)
    return time.perf_counter() - t0


def milvus_index_description(env: Mapping[str, str]) -> str:
    """The Milvus backends' index and read level as the retrievers see them (``T3AR_RETRIEVER_MILVUS_*`` in the
    environment they inherit, else the retriever's defaults)."""
    def get(name: str, default: str) -> str:
        return env.get(f"T3AR_RETRIEVER_MILVUS_{name}", default)

    kind = get("INDEX", "HNSW").upper()
    params = {"HNSW": f"M {get('HNSW_M', '16')}, efConstruction {get('HNSW_EF_CONSTRUCTION', '200')}, "
                      f"ef {get('HNSW_EF', '128')}",
              "IVF_FLAT": f"nlist {get('IVF_NLIST', '1024')}, nprobe {get('IVF_NPROBE', '32')}"}.get(kind)
    return f"{kind}" + (f" ({params})" if params else "") + f", {get('CONSISTENCY', 'Session')} consistency"


def bench_backends(work: Path, n: int, *, n_batches: int, n_single: int, n_deletes: int,
                   milvus_server_uri: str | None = None, lite: bool = True) -> dict[str, Any]:
    """The backends on the same ``n`` vectors; returns ``{"vectors", ..., "faiss": {...}, "milvus": {...},
    "milvus_server": {...}}`` (``milvus_server``: ``{"skipped": reason}`` without ``milvus_server_uri``;
    ``milvus``: ``{"skipped": ...}`` with ``lite=False``)."""
    from contextlib import ExitStack

    from t3ar_bench.retrieval.ann import mixture_vectors
    from t3ar_bench.retrieval.service import BATCH, DIM, K, percentiles, retriever_service

    chunk = CHUNK
    env = {"T3AR_RETRIEVER_EMBEDDER": "none", "T3AR_RETRIEVER_VECTOR_DIM": str(DIM),
           "T3AR_RETRIEVER_VECTOR_IDENTITY": "synthetic"}
    out: dict[str, Any] = {"vectors": n, "dim": DIM, "k": K, "batch": BATCH, "data": "structured (ann.MIXTURE)",
                           "milvus_uri": "milvus-lite (a file in the data directory)" if lite else
                           "milvus-lite not run (--no-milvus-lite)",
                           "faiss_index": "IVF (T3AR_RETRIEVER_INDEX_TYPE=ivf, nlist 1024, nprobe 32)",
                           "milvus_index": milvus_index_description(os.environ)}
    envs = {name: {**env, "T3AR_RETRIEVER_BACKEND": name} for name in BACKEND_NAMES}
    # the exact index takes two chunks before the first training (the flat cap is checked for count plus batch)
    envs["faiss"].update({"T3AR_RETRIEVER_INDEX_TYPE": "ivf", "T3AR_RETRIEVER_IVF_TRAIN_MIN": "1000",
                          "T3AR_RETRIEVER_IVF_FLAT_MAX": str(2 * CHUNK)})
    if not lite:
        del envs["milvus"]
        out["milvus"] = {"skipped": "left out of this run (--no-milvus-lite)"}
    if milvus_server_uri:
        envs["milvus_server"] = {**env, "T3AR_RETRIEVER_BACKEND": "milvus",
                                 "T3AR_RETRIEVER_MILVUS_URI": milvus_server_uri}
        out["milvus_server_version"] = server_version(milvus_server_uri)
    else:
        out["milvus_server"] = {"skipped": NO_SERVER}
    names = tuple(envs)
    with ExitStack() as stack:
        clients = {}
        for name in names:
            t0 = time.perf_counter()
            client, _ = stack.enter_context(retriever_service(work / f"backend-{name}", envs[name]))
            out[name] = {"start_s": time.perf_counter() - t0}
            clients[name] = client
        chunks = {start: _chunk(start, n) for start in range(0, n, chunk)}
        for name, client in clients.items():  # ingest one after the other (each uses the cores it can get)
            log.info("backends: loading %d vectors into %s", n, name)
            t0 = time.perf_counter()
            for start in range(0, n, chunk):
                client.add_vectors(chunks[start], identity="synthetic")
            out[name]["ingest_vectors_per_s"] = n / (time.perf_counter() - t0)
            assert client.stats().count == n
        out["faiss"]["index_ready_s"] = _wait_ivf(clients["faiss"])
        if "milvus_server" in clients:
            tag = clients["milvus_server"].stats().pool_tag
            assert milvus_server_uri
            log.info("backends: waiting for the Milvus server to index %d vectors", n)
            out["milvus_server"]["index_ready_s"] = wait_server_indexed(milvus_server_uri, f"t3ar_pool_{tag}", n)
        queries = mixture_vectors(BATCH * n_batches + n_single, seed=21)
        batches = [queries[i * BATCH:(i + 1) * BATCH] for i in range(n_batches)]
        for client in clients.values():
            client.search(batches[0], K)  # warm-up
        spent = dict.fromkeys(names, 0.0)
        same_top1 = 0
        for i, b in enumerate(batches):  # alternating order: all see the same load
            got = {}
            for name in (names if i % 2 else names[::-1]):
                t = time.perf_counter()
                got[name] = clients[name].search(b, K)
                spent[name] += time.perf_counter() - t
            other = "milvus_server" if "milvus_server" in got else "milvus"
            same_top1 += sum(x[0].split("-")[1] == y[0].split("-")[1]  # the same seq (each pool has its own tag)
                             for x, y in zip(got["faiss"].ids, got[other].ids, strict=True))
        single_q = queries[BATCH * n_batches:]
        truth = exact_top_k(chunks, single_q, K)
        times: dict[str, list[float]] = {name: [] for name in names}
        hits = dict.fromkeys(names, 0)
        for j, q in enumerate(single_q):
            for name in (names if j % 2 else names[::-1]):
                t = time.perf_counter()
                res = clients[name].search(q[None], K)
                times[name].append(time.perf_counter() - t)
                hits[name] += len({int(i.split("-")[1]) for i in res.ids[0]} & set(truth[j].tolist()))
        for name in names:
            out[name]["qps"] = BATCH * n_batches / spent[name]
            out[name]["single"] = percentiles(times[name])
            out[name]["recall_at_k"] = hits[name] / (len(single_q) * K)
            out[name]["vectors"] = n
        out["same_top1_share"] = same_top1 / (BATCH * n_batches)  # top-1 of faiss vs the (server's) Milvus
        rng = np.random.default_rng(5)
        victims = sorted(int(s) for s in rng.choice(np.arange(1, n + 1), size=n_deletes, replace=False))
        vec = {v: chunks[(v - 1) // chunk * chunk][(v - 1) % chunk] for v in victims}
        tag_of = {}
        for name, client in clients.items():
            tag = tag_of[name] = client.list_items(limit=1).items[0].id.split("-")[0]
            t_del, returned, found_before = [], 0, 0
            for v in victims:
                pid = f"{tag}-{v}"
                found_before += pid in client.search(vec[v][None], 10).ids[0]  # found before (an ANN may miss it)
                t = time.perf_counter()
                client.delete(pid)
                t_del.append(time.perf_counter() - t)
                returned += pid in client.search(vec[v][None], 10).ids[0]
            out[name]["delete"] = percentiles(t_del)
            out[name]["deleted_found_before"] = found_before
            out[name]["deleted_returned_after_2xx"] = returned
    if milvus_server_uri:
        _drop_collection(milvus_server_uri, tag_of["milvus_server"])
    return out


def _drop_collection(uri: str, tag: str) -> None:
    """The server is the caller's: leave it without the benchmark's collection."""
    try:
        from pymilvus import MilvusClient

        client = MilvusClient(uri=uri, timeout=30)
        try:
            client.drop_collection(f"t3ar_pool_{tag}")
        finally:
            client.close()
    except Exception:
        log.warning("could not drop the benchmark's collection t3ar_pool_%s on %s", tag, uri, exc_info=True)


_TITLES = {"faiss": "faiss", "milvus": "milvus-lite", "milvus_server": "Milvus server"}


def backends_markdown(b: dict[str, Any], *, title: str | None = None) -> list[str]:
    """The section's lines for retrieval.md (``title``: the heading, default the section's own)."""
    names = [name for name in ("faiss", "milvus", "milvus_server") if name in b and "skipped" not in b[name]]
    cols = [_TITLES[name] + (f" {b['milvus_server_version']}" if name == "milvus_server" else "") for name in names]
    side = [b[name] for name in names]
    zero = all(x["deleted_returned_after_2xx"] == 0 for x in side)

    why = (b.get("milvus_server") or {}).get("skipped", NO_SERVER)
    server = "" if "milvus_server" in names else f" A Milvus server was not measured in this run: {why}."
    return [
        title or f"## Pool backends: {' vs '.join(cols)}, {b['vectors']:,} vectors, {b['dim']}-d, k = {b['k']}",
        "",
        _setup(b, names) + "then measured over HTTP alternately. Deletes: `DELETE /pool/{id}` of a vector, then a "
        "search for that vector itself." + server,
        "",
        *_table(cols, side, b["batch"]),
        "",
        f"Goal (deleted ids returned = 0 on all): {'met' if zero else '**missed**'}. Top-1 ids of faiss and "
        f"{'the Milvus server' if 'milvus_server' in names else 'milvus-lite'} agree on "
        f"{b['same_top1_share']:.1%} of the batch queries.",
        "",
    ]


def _setup(b: dict[str, Any], names: Sequence[str]) -> str:
    """The paragraph's opening: which backends, indexes and data (runs before the ANN indexes said FLAT)."""
    where = ([b["milvus_uri"]] if "milvus" in names else []) + \
        (["a Milvus standalone server by URI"] if "milvus_server" in names else [])
    inside = " and ".join(where)
    if "milvus_index" not in b:
        return (f"Retriever processes, `T3AR_RETRIEVER_BACKEND=faiss` (the index in the retriever) and `milvus` "
                f"({inside}; FLAT inner product, Strong consistency on every search), loaded with the same "
                "synthetic vectors through `POST /pool/vectors` (all also commit them to SQLite, the pool's source "
                "of truth), ")
    return (f"Retriever processes, `T3AR_RETRIEVER_BACKEND=faiss` with {b['faiss_index']} and `milvus` ({inside}; "
            f"{b['milvus_index']}, every answer filtered against the pool's database), loaded with the same "
            f"{b.get('data', 'synthetic')} vectors through `POST /pool/vectors` (all also commit them to SQLite, "
            "the pool's source of truth; the Milvus server's collection is then sealed and indexed, faiss' IVF "
            "trained), recall@k of the single queries against the exact top k, ")


def _table(cols: list[str], side: list[dict[str, Any]], batch: int) -> list[str]:
    """The figures of the backends ``side`` (one column each, headed ``cols``) as a markdown table."""

    def row(label: str, cell: Any) -> str:
        return f"| {label} | " + " | ".join(cell(x) for x in side) + " |"

    return [
        "| | " + " | ".join(cols) + " |",
        "|---|" + "---|" * len(cols),
        row("service start (empty pool)", lambda x: f"{x['start_s']:.1f} s"),
        row("ingest, vectors/s", lambda x: f"{x['ingest_vectors_per_s']:,.0f}"),
        row(f"search QPS, batches of {batch}", lambda x: f"{x['qps']:,.0f}"),
        row("one query, p50 / p99", lambda x: f"{x['single']['p50_ms']:.1f} / {x['single']['p99_ms']:.1f} ms"),
        row("recall@k of those queries", lambda x: f"{x['recall_at_k']:.3f}" if "recall_at_k" in x else "–"),
        row(f"`DELETE`, p50 / p99 (n = {side[0]['delete']['n']})",
            lambda x: f"{x['delete']['p50_ms']:.1f} / {x['delete']['p99_ms']:.1f} ms"),
        row("deleted ids returned after the 2xx (goal 0)", lambda x: f"{x['deleted_returned_after_2xx']}"),
    ]


def server_column(b: dict[str, Any], **context: Any) -> dict[str, Any] | None:
    """The real Milvus server's column of a backends section ``b`` with its size, the server's version and
    ``context`` (when and how it was measured), or None when ``b`` measured no server."""
    column = b.get("milvus_server")
    if not isinstance(column, dict) or "qps" not in column:
        return None
    return {**column, "vectors": b.get("vectors"), "batch": b.get("batch"),
            "milvus_server_version": b.get("milvus_server_version"), **context}


def keep_server_column(b: dict[str, Any], previous: dict[str, Any], *, measured_at: str, command: str) -> None:
    """Set ``b[SERVER_KEY]``, the last real Milvus server measured: this section's own when it measured one
    (stamped with ``measured_at`` and ``command``), else the one ``previous`` (the results this run replaces)
    held, in its ``backends`` or in a ``--only backends`` run's ``backends_separate``, marked carried over. A
    run given no ``--milvus-uri`` so never drops the server's figures."""
    own = server_column(b, measured_at=measured_at, command=command, carried_over=False)
    if own:
        b[SERVER_KEY] = own
        return
    old = (previous.get("backends") or {}).get(SERVER_KEY)
    if not old:
        sep = previous.get("backends_separate") or {}
        old = server_column(sep, measured_at=sep.get("measured_at"), command=sep.get("command"),
                            load_average_start=sep.get("load_average_start"))
    if old:
        b[SERVER_KEY] = {**old, "carried_over": True}


def server_markdown(column: dict[str, Any]) -> list[str]:
    """retrieval.md's lines for a real server's column measured apart from the run around it."""
    version = column.get("milvus_server_version") or ""
    note = f" {column['note']}" if column.get("note") else ""
    return [
        "### The last real Milvus server measured (not in this run)",
        "",
        *_table([f"Milvus server {version}".strip()], [column], column.get("batch") or 256),
        "",
        f"Measured on {column.get('measured_at') or 'an unknown date'} by `{column.get('command') or '?'}` "
        f"({column.get('vectors') or 0:,} vectors), apart from the table above: compare it with the columns "
        f"measured beside it, not with these.{note} Kept as `backends[\"{SERVER_KEY}\"]` in retrieval.json until a "
        "run measures a server again.",
        "",
    ]

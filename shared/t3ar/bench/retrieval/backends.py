"""The ``backends`` section of ``t3ar bench retrieval``: the retriever's pool backends side by side (issues 12, 29).

Real retriever processes on 127.0.0.1, one with ``T3AR_RETRIEVER_BACKEND=faiss`` (in-process index), one with
``milvus`` (milvus-lite in the data directory) and, when a Milvus server's URI is given (``--milvus-uri``), one
with ``milvus`` on that server (``milvus_server``; the benchmark does not start a server, it measures the one
it is given). All vectors-only and loaded with the same synthetic 512-d unit vectors through
``POST /pool/vectors``. Measured over HTTP with ``RetrieverClient``, alternating between the services so that
all see the same machine load: bulk ingest rate (vectors/s, including the SQLite commit every backend shares),
batch QPS (256 queries, k = 50), single-query latency, and deletes (``DELETE /pool/{id}`` latency, then a search
for the deleted vector itself: how many deleted ids are returned after the 2xx, which must be 0 on all).
"""

from __future__ import annotations

import logging
import time
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


def bench_backends(work: Path, n: int, *, n_batches: int, n_single: int, n_deletes: int,
                   milvus_server_uri: str | None = None) -> dict[str, Any]:
    """The backends on the same ``n`` vectors; returns ``{"vectors", ..., "faiss": {...}, "milvus": {...},
    "milvus_server": {...}}`` (``milvus_server``: ``{"skipped": reason}`` without ``milvus_server_uri``)."""
    from contextlib import ExitStack

    from t3ar.bench.retrieval.service import BATCH, DIM, K, percentiles, retriever_service, unit_vectors

    chunk = 50_000
    env = {"T3AR_RETRIEVER_EMBEDDER": "none", "T3AR_RETRIEVER_VECTOR_DIM": str(DIM),
           "T3AR_RETRIEVER_VECTOR_IDENTITY": "synthetic"}
    out: dict[str, Any] = {"vectors": n, "dim": DIM, "k": K, "batch": BATCH,
                           "milvus_uri": "milvus-lite (a file in the data directory)"}
    envs = {name: {**env, "T3AR_RETRIEVER_BACKEND": name} for name in BACKEND_NAMES}
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
        for name, client in clients.items():  # ingest one after the other (each uses the cores it can get)
            log.info("backends: loading %d vectors into %s", n, name)
            t0 = time.perf_counter()
            for start in range(0, n, chunk):
                client.add_vectors(unit_vectors(min(chunk, n - start), seed=1000 + start // chunk),
                                   identity="synthetic")
            out[name]["ingest_vectors_per_s"] = n / (time.perf_counter() - t0)
            assert client.stats()["count"] == n
        queries = unit_vectors(BATCH * n_batches + n_single, seed=21)
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
            same_top1 += sum(x[0].split("-")[1] == y[0].split("-")[1]  # the same seq (each pool has its own tag)
                             for x, y in zip(got["faiss"].ids, got["milvus"].ids, strict=True))
        singles = dict.fromkeys(names)
        times: dict[str, list[float]] = {name: [] for name in names}
        for j, q in enumerate(queries[BATCH * n_batches:]):
            for name in (names if j % 2 else names[::-1]):
                t = time.perf_counter()
                clients[name].search(q[None], K)
                times[name].append(time.perf_counter() - t)
        for name in names:
            out[name]["qps"] = BATCH * n_batches / spent[name]
            singles[name] = out[name]["single"] = percentiles(times[name])
        out["same_top1_share"] = same_top1 / (BATCH * n_batches)  # both are exact: ids agree up to ties
        rng = np.random.default_rng(5)
        victims = sorted(int(s) for s in rng.choice(np.arange(1, n + 1), size=n_deletes, replace=False))
        chunks = {s: unit_vectors(min(chunk, n - s), seed=1000 + s // chunk)
                  for s in sorted({(v - 1) // chunk * chunk for v in victims})}
        vec = {v: chunks[(v - 1) // chunk * chunk][(v - 1) % chunk] for v in victims}
        tag_of = {}
        for name, client in clients.items():
            tag = tag_of[name] = client.list_items(limit=1)["items"][0]["id"].split("-")[0]
            t_del, returned = [], 0
            for v in victims:
                pid = f"{tag}-{v}"
                assert client.search(vec[v][None], 1).ids[0] == [pid]  # its own nearest neighbour before
                t = time.perf_counter()
                client.delete(pid)
                t_del.append(time.perf_counter() - t)
                returned += pid in client.search(vec[v][None], 10).ids[0]
            out[name]["delete"] = percentiles(t_del)
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
        f"Retriever processes, `T3AR_RETRIEVER_BACKEND=faiss` (the index in the retriever) and `milvus` "
        f"({b['milvus_uri']}" + (", and a Milvus standalone server by URI" if "milvus_server" in names else "") +
        "; FLAT inner product, Strong consistency on every search), loaded with the same "
        "synthetic vectors through `POST /pool/vectors` (all also commit them to SQLite, the pool's source of "
        "truth), then measured over HTTP alternately. Deletes: `DELETE /pool/{id}` of a vector, then a search for "
        "that vector itself." + server,
        "",
        *_table(cols, side, b["batch"]),
        "",
        f"Goal (deleted ids returned = 0 on all): {'met' if zero else '**missed**'}. Top-1 ids of faiss and "
        f"milvus-lite agree on {b['same_top1_share']:.1%} of the batch queries (exact searches; ties may order "
        "differently).",
        "",
    ]


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

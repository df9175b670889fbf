"""Markdown of the ``ann`` section (:mod:`t3ar_bench.retrieval.ann`) of ``docs/benchmarks/retrieval.md``."""

from __future__ import annotations

from typing import Any

RECALL_GOAL, LATENCY_GOAL_MS = 0.95, 10.0


def ann_goals(r: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    a = r.get("ann")
    if not a:
        return []
    return [
        (f"IVF recall@50 at {a['vectors']:,} structured vectors (nprobe {a['nprobe']})",
         f"{a['recall_at_50']:.3f}", f">= {RECALL_GOAL}", a["recall_at_50"] >= RECALL_GOAL),
        ("IVF single-query p50 at that nprobe (in-process, 1 thread; HTTP adds the overhead above)",
         f"{a['single_query_p50_ms']:.1f} ms", f"<= {LATENCY_GOAL_MS:.0f} ms",
         a["single_query_p50_ms"] <= LATENCY_GOAL_MS),
    ]


def _real_label(st: dict[str, Any] | None) -> str:
    if st and st.get("carried_over"):
        return (f"real pool-kit embeddings (measured on {st.get('measured_at') or 'an earlier run'}, carried over: "
                "no cached embeddings this run)")
    return "real pool-kit embeddings (measured this run)"


def _structure_row(name: str, st: dict[str, Any] | None) -> str:
    if not st:
        return f"| {name} | not available | | | | | |"
    return (f"| {name} | {st['n']:,} x {st['dim']} | {st['mean_cos_random']:.2f} | {st['cos_nn1']:.2f} | "
            f"{st['cos_nn50']:.2f} | {st['relative_contrast_50']:.2f} | {st['lid_50']:.1f} |")


def ann_section(r: dict[str, Any]) -> list[str]:
    a = r.get("ann")
    if not a:
        return []
    st, un = a["structured"], a["uniform"]
    mix = a["mixture"]
    dev = a.get("device") or {}
    lines = [
        f"## Approximate index (IVF): {a['vectors']:,} vectors, {a['dim']}-d, k = {a['k']}, nlist {a['nlist']}",
        "",
        "The service's IVF index (`IndexIVFFlat`, inner product, trained on 256 vectors per list), built in the "
        "benchmark process; recall@50 against exact top-50 (`faiss.knn` on the same array) over "
        f"{st['sweep'][0]['single']['n']} single queries timed one at a time on one thread (the service's policy). "
        "Queries are held-out samples of the same distribution. Module docstring of `t3ar_bench.retrieval.ann`: "
        "how the data were chosen.",
        "",
        "**Data.** *Structured*: a fixed Gaussian mixture on the sphere "
        f"({mix['components']} components, Dirichlet weights, centres sharing a common direction "
        f"{mix['common_direction']}, each spread over its own {mix['subspace_dim']}-d subspace, scale "
        f"{mix['spread']}, isotropic noise {mix['noise']}), chosen before any IVF result by matching the "
        "neighbourhood structure of real embeddings of the pool kit's images (packaged EfficientNet-Lite0, "
        "1280-d) at the same sample size; it is slightly *harder* than the real set (lower relative contrast). "
        "*Uniform*: unit vectors uniform on the sphere, no neighbourhood structure: the worst case, which real "
        "embeddings never resemble.",
        "",
        "| set | sample | mean cos (random pairs) | cos to 1st NN | cos to 50th NN | relative contrast@50 | "
        "LID@50 |",
        "|---|---|---|---|---|---|---|",
        _structure_row(_real_label(a.get("real_structure")), a.get("real_structure")),
        _structure_row("structured generator", st["structure"]),
        _structure_row("uniform", un["structure"]),
        "",
        "| nprobe | share of lists | recall@50, structured | single query p50 / p99 | recall@50, uniform | "
        "single query p50 / p99 |",
        "|---|---|---|---|---|---|",
    ]
    for s_row, u_row in zip(st["sweep"], un["sweep"], strict=True):
        lines.append(f"| {s_row['nprobe']} | {s_row['nprobe'] / st['nlist']:.1%} | {s_row['recall_at_50']:.3f} | "
                     f"{s_row['single']['p50_ms']:.1f} / {s_row['single']['p99_ms']:.1f} ms | "
                     f"{u_row['recall_at_50']:.3f} | {u_row['single']['p50_ms']:.1f} / "
                     f"{u_row['single']['p99_ms']:.1f} ms |")
    lines += [
        "",
        f"Exact search on the same arrays, one query on one thread: p50 {st['exact_single']['p50_ms']:.0f} ms "
        f"(structured), {un['exact_single']['p50_ms']:.0f} ms (uniform). IVF training (k-means on "
        f"{st['nlist'] * 256:,} vectors) took {st['train_seconds']:.0f} s and adding {a['vectors']:,} vectors "
        f"{st['add_seconds']:.0f} s on this machine: the service does this in a background thread "
        "(`T3AR_RETRIEVER_IVF_TRAIN_MIN`, `_IVF_RETRAIN_GROWTH`) while exact search serves.",
        "",
        "**Exact search on a GPU** (`T3AR_RETRIEVER_DEVICE=cuda`): "
        + (f"{dev['device']}: one query p50 {dev['single']['p50_ms']:.2f} ms, a batch of 256 "
           f"{dev['batch256_seconds'] * 1000:.1f} ms, against {dev['cpu_faiss_batch256_seconds'] * 1000:.0f} ms for "
           "faiss flat on " + (dev.get("cpu") or "this machine's CPU") + "."
           + (f" {dev['note']}" if dev.get("note") else "") if dev.get("available") else
           f"not measured in this run ({dev.get('reason', 'no GPU')}). The code path (a torch matrix product and "
           "top-k over a device copy of the vectors, kept in sync with adds and compactions) is tested on CPU "
           "torch against faiss flat."),
        "",
    ]
    return lines

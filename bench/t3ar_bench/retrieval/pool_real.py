"""``t3ar bench pool``'s real-embedding sanity set: the compressed index on real image embeddings.

The synthetic vectors of the pool benchmark have the neighbourhood structure of real embeddings, but they are
generated. This check builds the retriever's own index (:class:`~t3ar_services.retriever.index.VectorIndex`,
``ivfpq``: IVF-PQ codes in RAM, candidates re-ranked exactly against float16 rows on disk) over real embeddings
(``.npy`` files of L2-normalised rows, one model's) with the run's parameters (nprobe, bytes of code per vector,
re-rank factor; nlist by the same rule, about the square root of the count), in this process, and measures it
against exact search on the same vectors: recall@50 of held-out queries drawn from the same set, and the
single-query time of both. A sanity check at small scale (thousands to tens of thousands of vectors), not a
measurement at the pool's size.
"""

from __future__ import annotations

import glob
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from t3ar_bench.retrieval.pool10m import default_nlist, recall
from t3ar_bench.retrieval.service import percentiles

K = 50
NORM_TOLERANCE = 1e-3  # rows whose length is further than this from 1 are not L2-normalised embeddings
TIE_TOLERANCE = 1e-5  # a result whose exact score is this close to the k-th exact score counts (see recall_ties)
MIN_VECTORS = 1000  # fewer cannot train IVF-PQ's 256-centroid codebooks and leave held-out queries
QUERY_SEED = 5


class RealEmbeddingsError(ValueError):
    """The given embeddings cannot be used (no files, not 2-D, mixed dimensions, not normalised, too few)."""


def embedding_files(paths: Sequence[Path]) -> list[Path]:
    """The ``.npy`` files named by ``paths``: files as given, directories' ``*.npy`` files, the files a glob pattern
    (``*``, ``?``, ``[``: one model's files of a cache, say, quoted for the shell) matches, each sorted."""
    out: list[Path] = []
    for p in paths:
        if any(c in str(p) for c in "*?["):
            matched = sorted(Path(f) for f in glob.glob(str(p)) if Path(f).is_file())
            if not matched:
                raise RealEmbeddingsError(f"{p}: no file matches this pattern")
            out += embedding_files(matched)
        elif p.is_dir():
            found = sorted(f for f in p.glob("*.npy") if f.is_file())
            if not found:
                raise RealEmbeddingsError(f"{p}: no .npy files in this directory")
            out += found
        elif p.is_file():
            if p.suffix != ".npy":
                raise RealEmbeddingsError(f"{p}: not a .npy file")
            out.append(p)
        else:
            raise RealEmbeddingsError(f"{p}: no such file or directory")
    return list(dict.fromkeys(out))


def load_embeddings(paths: Sequence[Path]) -> tuple[np.ndarray, dict[str, Any]]:
    """All rows of the ``.npy`` files under ``paths`` as one float32 array (rows repeated exactly dropped), and
    where they came from. Raises :class:`RealEmbeddingsError` for anything that is not one set of L2-normalised
    embeddings of one dimension."""
    files = embedding_files(paths)
    arrays = []
    for f in files:
        try:
            a = np.load(f, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise RealEmbeddingsError(f"{f}: not a readable .npy array ({e})") from e
        if a.ndim != 2 or not np.issubdtype(a.dtype, np.floating):
            raise RealEmbeddingsError(f"{f}: expected a 2-D float array of embeddings, got {a.dtype} {a.shape}")
        if len(a):
            arrays.append(a.astype(np.float32))
    dims = sorted({a.shape[1] for a in arrays})
    if len(dims) > 1:
        raise RealEmbeddingsError(f"the files mix dimensions {dims}: one model's embeddings only")
    loaded = sum(len(a) for a in arrays)
    if loaded < MIN_VECTORS:
        raise RealEmbeddingsError(f"{loaded} embeddings in {len(files)} file(s): at least {MIN_VECTORS} are needed")
    x = np.concatenate(arrays)
    if not np.isfinite(x).all():
        raise RealEmbeddingsError("the embeddings hold NaN or infinite values")
    norms = np.linalg.norm(x, axis=1)
    off = int((np.abs(norms - 1) > NORM_TOLERANCE).sum())
    if off:
        raise RealEmbeddingsError(f"{off} of {loaded} rows are not L2-normalised (|norm - 1| > {NORM_TOLERANCE})")
    x = np.unique(x, axis=0)
    x /= np.linalg.norm(x, axis=1, keepdims=True)  # exactly unit length, as the retriever stores them
    parents = sorted({str(f.parent) for f in files})
    return x, {"files": len(files), "folders": parents, "vectors_loaded": loaded,
               "exact_duplicates_dropped": loaded - len(x), "dim": int(x.shape[1])}


def pq_m_for(dim: int, wanted: int) -> int:
    """The run's bytes of code per vector if they divide ``dim`` (IVF-PQ needs it), else the largest divisor of
    ``dim`` below it."""
    return next(m for m in range(min(wanted, dim), 0, -1) if dim % m == 0)


def recall_ties(found_scores: Sequence[np.ndarray], truth_kth: np.ndarray, k: int = K) -> float:
    """Recall@k that counts a returned item as a true neighbour when its exact score reaches the k-th exact score
    (within :data:`TIE_TOLERANCE`), as ann-benchmarks does: real pools hold near-copies (one image in two emoji
    sets) whose scores tie at the k-th place, where which copy an exact search keeps is arbitrary.
    ``found_scores[i]``: the exact scores of what query i got back; ``truth_kth[i]``: its k-th exact score."""
    hits = [int((s >= t - TIE_TOLERANCE).sum()) for s, t in zip(found_scores, truth_kth, strict=True)]
    return float(np.mean([h / k for h in hits]))


def bench_real(x: np.ndarray, work: Path, *, n_queries: int, nprobe: int, pq_m: int, rerank: int,
               source: dict[str, Any]) -> dict[str, Any]:
    """Recall@50 and single-query time of the ``ivfpq`` index over ``x`` (unit rows) against exact search, with
    ``n_queries`` rows held out as queries. ``work``: a scratch folder for the float16 rows."""
    import faiss

    from t3ar_services.retriever.index import IndexConfig, VectorIndex

    n_queries = min(n_queries, len(x) // 10)
    pick = np.random.default_rng(QUERY_SEED).permutation(len(x))
    queries, base = np.ascontiguousarray(x[pick[:n_queries]]), np.ascontiguousarray(x[pick[n_queries:]])
    dim, n = base.shape[1], len(base)
    m, nlist = pq_m_for(dim, pq_m), default_nlist(n)
    exact = faiss.IndexFlatIP(dim)
    exact.add(base)
    work.mkdir(parents=True, exist_ok=True)
    config = IndexConfig(kind="ivfpq", nlist=nlist, nprobe=nprobe, threads=1, pq_m=m, rerank=rerank,
                         vector_file=work / "real-vectors.f16")
    t = time.perf_counter()
    index = VectorIndex.build(dim, config, [(np.arange(1, n + 1, dtype=np.int64), base)])
    build_s = time.perf_counter() - t
    if index.kind != "ivfpq":
        raise RealEmbeddingsError(f"{n} vectors did not train an IVF-PQ index (got {index.kind})")
    threads = faiss.omp_get_max_threads()  # the calling thread's OpenMP setting: restored after
    faiss.omp_set_num_threads(1)  # one query at a time, as the retriever answers a single query
    try:
        found: list[np.ndarray] = []
        t_ann, t_exact = [], []
        exact.search(queries[:1], K)  # warm-up of both
        index.search(queries[:1], K)
        truth_s, truth_i = np.empty((n_queries, K), np.float32), np.empty((n_queries, K), np.int64)
        for j, q in enumerate(queries):
            t = time.perf_counter()
            truth_scores, truth_ids = exact.search(q[None], K)
            t_exact.append(time.perf_counter() - t)
            truth_s[j], truth_i[j] = truth_scores[0], truth_ids[0] + 1  # seqs are 1-based
            t = time.perf_counter()
            found.append(index.search(q[None], K)[1][0])
            t_ann.append(time.perf_counter() - t)
    finally:
        faiss.omp_set_num_threads(threads)
    if index.vectors is not None:
        index.vectors.close()
    found_scores = [base[f - 1] @ q for f, q in zip(found, queries, strict=True)]
    return {"measured": True, **source, "vectors": n, "queries": n_queries, "k": K,
            "index": {"type": index.kind, "nlist": int(index.nlist or nlist), "nprobe": index.nprobe, "pq_m": m,
                      "rerank_factor": rerank},
            "build_s": build_s, "recall_at_50": recall_ties(found_scores, truth_s[:, -1]),
            "recall_at_50_ids": recall([f.tolist() for f in found], truth_i),
            "single": percentiles(t_ann), "exact_single": percentiles(t_exact),
            "timing": "in-process, one thread, one query per search, no HTTP"}

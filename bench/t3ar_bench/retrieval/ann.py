"""The ``ann`` section of the retriever benchmark: IVF recall@50 against exact search at 1M x 512-d, and the
single-query latency that buys it; plus exact search on a GPU against the CPU index when a GPU is present.

**Data.** IVF recall depends on the data's neighbourhood structure, so the set matters more than anything else:

- *structured* (the goal): a fixed Gaussian-mixture generator on the unit sphere, chosen before any IVF result
  was looked at by matching the structure of real embeddings: the packaged EfficientNet-Lite0 (1280-d)
  embeddings of the pool kit's images (cliparts, stamps, emoji; 14,594 distinct vectors, from the adaptation
  benchmark's cache). Measured on both at the same sample size (14,594), 500 queries (real / generator):
  mean cosine of random pairs 0.27 / 0.26, cosine to the 1st neighbour 0.83 / 0.80, to the 50th 0.65 / 0.60,
  relative contrast at 50 (mean random distance / distance to the 50th neighbour, He et al. 2012) 1.49 /
  1.38, local intrinsic dimensionality at 50 (MLE, Amsaleg et al. 2015) 13.9 / 12.3. Lower contrast means
  harder search, so the generator errs on the hard side. Parameters (:data:`MIXTURE`): 256 components with
  Dirichlet(1) weights whose centres share a common direction (CNN features live in a cone), each spread over
  its own random 16-d subspace (scale 0.6), plus isotropic noise (0.4). The 1M set is more samples of the same
  generator (a bigger pool of the same kind of images, so neighbours are closer than at 14,594).
- *uniform* (the worst case): unit vectors uniform on the sphere: no neighbourhood structure at all, every
  point about equally far from every other, the regime where IVF needs to probe most lists. Real embeddings
  never look like this; it bounds what IVF can do.

When the real embeddings are on disk (``.cache/bench-adapt/embeddings``, written by ``t3ar bench adaptation``),
the run measures their structure again and reports it next to the generator's.

**Method.** The index the service builds (``VectorIndex`` is a service module, which the library does not
import; the benchmark builds the same faiss ``IndexIVFFlat``: inner product, nlist 1024, trained on 256 vectors
per list) in this process. Ground truth: exact top-50 by ``faiss.knn`` on the same arrays (no second copy).
Queries: held-out samples of the same distribution. Single-query latency: one query at a time, one OpenMP
thread (the service's policy for single queries); HTTP adds ``search.single_overhead_p50_ms`` on top.
Memory: one 1M x 512 float32 array (1.9 GiB) and the IVF index (another 1.9 GiB) at a time.
"""

from __future__ import annotations

import gc
import glob
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from t3ar_bench.retrieval.service import percentiles

log = logging.getLogger(__name__)
K = 50
DIM = 512
MIXTURE = {"components": 256, "subspace_dim": 16, "spread": 0.6, "noise": 0.4, "common_direction": 0.8}
NPROBES = (4, 8, 16, 32, 64, 128)
REAL_EMBEDDINGS = Path(".cache/bench-adapt/embeddings")
STRUCTURE_SAMPLE = 14_594  # the size of the real set the generator was matched on: compare at the same size


def mixture_vectors(n: int, seed: int, dim: int = DIM, chunk: int = 65_536) -> np.ndarray:
    """``n`` samples of the structured generator (unit rows). The generator itself (centres, subspaces,
    weights) is fixed; ``seed`` only picks the samples, so base and query sets come from one distribution."""
    p = MIXTURE
    g = np.random.default_rng(12345)  # the distribution
    c, r = int(p["components"]), int(p["subspace_dim"])
    common = g.standard_normal(dim).astype(np.float32)
    common /= np.linalg.norm(common)
    centres = p["common_direction"] * common + g.standard_normal((c, dim)).astype(np.float32) / np.sqrt(dim)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    weights = g.dirichlet(np.ones(c))
    bases = (g.standard_normal((c, dim, r)) / np.sqrt(dim)).astype(np.float32)
    rng = np.random.default_rng(seed)  # the samples
    out = np.empty((n, dim), dtype=np.float32)
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        lab = rng.choice(c, m, p=weights)
        z = rng.standard_normal((m, r)).astype(np.float32)
        x = centres[lab] + rng.standard_normal((m, dim)).astype(np.float32) * (p["noise"] / np.sqrt(dim))
        for comp in np.unique(lab):
            rows = lab == comp
            x[rows] += (z[rows] @ bases[comp].T) * (p["spread"] / np.sqrt(r))
        out[start:start + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def uniform_vectors(n: int, seed: int, dim: int = DIM, chunk: int = 65_536) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.empty((n, dim), dtype=np.float32)
    for start in range(0, n, chunk):
        x = rng.standard_normal((min(chunk, n - start), dim), dtype=np.float32)
        out[start:start + len(x)] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def structure(x: np.ndarray, k: int = K, n_queries: int = 500, seed: int = 0) -> dict[str, float]:
    """Neighbourhood statistics of a set of unit vectors (rows are normalised here): mean cosine of random
    pairs and to the 1st / k-th neighbour, relative contrast at k, median local intrinsic dimensionality."""
    import faiss

    x = np.ascontiguousarray(x / np.linalg.norm(x, axis=1, keepdims=True), dtype=np.float32)
    rng = np.random.default_rng(seed)
    qi = rng.choice(len(x), min(n_queries, len(x)), replace=False)
    sims, _ = faiss.knn(x[qi], x, k + 1, metric=faiss.METRIC_INNER_PRODUCT)
    sims = sims[:, 1:]  # the query itself
    dist = np.sqrt(np.maximum(2 - 2 * sims, 1e-12))
    cos_rand = np.sum(x[qi] * x[rng.choice(len(x), len(qi))], axis=1)
    d_rand = np.sqrt(np.maximum(2 - 2 * cos_rand, 1e-12))
    lid = -1 / np.mean(np.log(np.maximum(dist[:, :-1], 1e-9) / dist[:, -1:]), axis=1)
    return {"n": len(x), "dim": int(x.shape[1]), "mean_cos_random": float(cos_rand.mean()),
            "cos_nn1": float(sims[:, 0].mean()), f"cos_nn{k}": float(sims[:, -1].mean()),
            f"relative_contrast_{k}": float(d_rand.mean() / dist[:, -1].mean()),
            f"lid_{k}": float(np.median(lid[np.isfinite(lid)]))}


def real_structure(folder: Path = REAL_EMBEDDINGS) -> dict[str, Any] | None:
    """Structure of the cached real pool embeddings (pool components, not target queries), if present."""
    files = [f for f in glob.glob(str(folder / "*.npy")) if "-queries-" not in Path(f).name]
    if not files:
        return None
    arrays = [np.load(f) for f in files]
    dims = {a.shape[1] for a in arrays if a.ndim == 2}
    if len(dims) != 1:
        return None
    real = np.unique(np.concatenate([a for a in arrays if a.ndim == 2 and len(a)]), axis=0)
    return {"source": str(folder), **structure(real)}


def _ivf_sweep(base: np.ndarray, queries: np.ndarray, nlist: int, n_single: int) -> dict[str, Any]:
    import faiss

    t0 = time.perf_counter()
    exact = faiss.knn(queries, base, K, metric=faiss.METRIC_INNER_PRODUCT)[1]
    t_exact = time.perf_counter() - t0
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    t0 = time.perf_counter()
    sample = base[np.random.default_rng(0).permutation(len(base))[: nlist * 256]]
    quantizer: Any = faiss.IndexFlatIP(DIM)
    ivf: Any = faiss.IndexIVFFlat(quantizer, DIM, nlist, faiss.METRIC_INNER_PRODUCT)
    ivf.train(sample)
    t_train = time.perf_counter() - t0
    del sample
    t0 = time.perf_counter()
    ivf.add_with_ids(base, np.arange(1, len(base) + 1, dtype=np.int64))
    t_add = time.perf_counter() - t0
    f: Any = faiss  # the bundled stubs lack the kwargs constructors
    sweep: list[dict[str, Any]] = []
    for nprobe in NPROBES:
        if nprobe > nlist:
            continue
        params = f.SearchParametersIVF(nprobe=nprobe)
        faiss.omp_set_num_threads(os.cpu_count() or 1)
        _, got = ivf.search(queries, K, params=params)
        recall = float(np.mean([len(set((g[g > 0] - 1).tolist()) & set(e.tolist())) / K
                                for g, e in zip(got, exact, strict=True)]))
        faiss.omp_set_num_threads(1)  # the service's policy for single queries
        times = []
        for q in queries[:n_single]:
            t = time.perf_counter()
            ivf.search(q[None], K, params=params)
            times.append(time.perf_counter() - t)
        sweep.append({"nprobe": nprobe, "recall_at_50": recall, "single": percentiles(times, with_max=False)})
        log.info("ann: nprobe %d recall@50 %.3f p50 %.1f ms", nprobe, recall, sweep[-1]["single"]["p50_ms"])
    exact_times = []
    for q in queries[: max(3, n_single // 20)]:
        t = time.perf_counter()
        faiss.knn(q[None], base, K, metric=faiss.METRIC_INNER_PRODUCT)
        exact_times.append(time.perf_counter() - t)
    del ivf, quantizer
    gc.collect()
    return {"nlist": nlist, "train_seconds": t_train, "add_seconds": t_add, "exact_batch_seconds": t_exact,
            "exact_single": percentiles(exact_times, with_max=False), "sweep": sweep}


def _operating_point(sweep: list[dict[str, Any]], goal: float = 0.95) -> dict[str, Any]:
    """The smallest nprobe reaching the recall goal, else the one with the best recall."""
    ok = [s for s in sweep if s["recall_at_50"] >= goal]
    return min(ok, key=lambda s: s["nprobe"]) if ok else max(sweep, key=lambda s: s["recall_at_50"])


def bench_device(base: np.ndarray, queries: np.ndarray, n_single: int) -> dict[str, Any]:
    """Exact search by the retriever's TorchFlat mirror on CUDA against faiss flat on the CPU (same data)."""
    try:
        import torch
    except ImportError:
        return {"available": False, "reason": "torch is not installed"}
    if not torch.cuda.is_available():
        return {"available": False, "reason": "no CUDA device on this machine: the GPU path was not measured"}
    import faiss

    from t3ar.torch_search import TorchFlat

    dev = TorchFlat.from_array(base, np.arange(1, len(base) + 1, dtype=np.int64), "cuda")
    dev.search(queries[:1], K)
    t_single = []
    for q in queries[:n_single]:
        t = time.perf_counter()
        dev.search(q[None], K)
        t_single.append(time.perf_counter() - t)
    t = time.perf_counter()
    dev.search(queries[:256], K)
    t_batch = time.perf_counter() - t
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    t = time.perf_counter()
    faiss.knn(queries[:256], base, K, metric=faiss.METRIC_INNER_PRODUCT)
    t_cpu_batch = time.perf_counter() - t
    out = {"available": True, "device": torch.cuda.get_device_name(0), "single": percentiles(t_single, with_max=False),
           "batch256_seconds": t_batch, "cpu_faiss_batch256_seconds": t_cpu_batch}
    del dev
    torch.cuda.empty_cache()
    return out


def bench_ann(n: int, n_queries: int, n_single: int, nlist: int,
              real_dir: Path = REAL_EMBEDDINGS) -> dict[str, Any]:
    """The whole section (see the module docstring). ``real_dir``: cached real pool embeddings, if any."""
    out: dict[str, Any] = {"vectors": n, "dim": DIM, "k": K, "nlist": nlist, "mixture": dict(MIXTURE),
                           "real_structure": real_structure(real_dir)}
    for name, make in (("structured", mixture_vectors), ("uniform", uniform_vectors)):
        t0 = time.perf_counter()
        base = make(n, seed=1)
        queries = make(n_queries, seed=2)
        log.info("ann: %s set of %d vectors made in %.0fs", name, n, time.perf_counter() - t0)
        part = {"structure": structure(base[:STRUCTURE_SAMPLE]), **_ivf_sweep(base, queries, nlist, n_single)}
        if name == "uniform":
            out["device"] = bench_device(base, queries, n_single)
        out[name] = part
        del base, queries
        gc.collect()
    best = _operating_point(out["structured"]["sweep"])
    out.update({"nprobe": best["nprobe"], "recall_at_50": best["recall_at_50"],
                "single_query_p50_ms": best["single"]["p50_ms"]})
    return out

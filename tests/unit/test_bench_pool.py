"""``t3ar bench pool``'s pure parts: the streamed exact top-k, the default nlist, recall and the report's labels."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from t3ar_bench.retrieval.pool10m import TopK, default_nlist, recall
from t3ar_bench.retrieval.pool10m_cmd import headline, write_report


def test_topk_streamed_over_chunks_equals_exact_search() -> None:
    g = np.random.default_rng(0)
    base, q = g.standard_normal((1000, 8)).astype(np.float32), g.standard_normal((5, 8)).astype(np.float32)
    top = TopK(q, 10)
    for start in range(0, 1000, 300):
        top.add(start + 1, base[start:start + 300])
    exact = np.argsort(-(q @ base.T), axis=1)[:, :10] + 1
    assert [set(r.tolist()) for r in top.ids] == [set(r.tolist()) for r in exact]
    assert recall([r.tolist() for r in exact], top.ids) == 1.0
    assert recall([r.tolist()[:5] for r in exact], top.ids) == 0.5


def test_default_nlist_is_about_the_square_root() -> None:
    assert default_nlist(10_000_000) == 4096 and default_nlist(200_000) == 512 and default_nlist(100) == 64


def _result(n: int) -> dict[str, object]:
    mem = {"rss_bytes": 3 << 30, "rss_anon_bytes": 1 << 30, "rss_file_bytes": 2 << 30}
    p = {"p50_ms": 4.0, "p99_ms": 9.0}
    return {"vectors": n, "dim": 512, "k": 50, "data": "structured", "raw_float32_bytes": n * 2048,
            "index": {"type": "ivfpq", "nlist": 512, "nprobe": 32, "pq_m": 64, "rerank_factor": 4, "train_min": 1000},
            "trained_on": n, "single": p, "recall_at_50": 0.97, **mem, "disk_bytes": 5 << 30,
            "disk_breakdown": {"pool.sqlite3": 4 << 30}, "cold_start_s": 3.0, "deleted_still_returned": 0,
            "deleted_returned_after_2xx": 0, "deleted_returned_after_restart": 0, "deletes": 10, "delete": p,
            "ingest_vectors_per_s": 5000.0, "ingest_wall_s": 40.0, "train_wait_after_ingest_s": 1.0,
            "cold_start_repairs": [], "single_after_restart": p, "memory_after_restart": mem, "memory_empty": mem,
            "anon_bytes_per_vector": 100.0,
            "real_embeddings": {"measured": False, "why": "none here"}, "command": "t3ar bench pool",
            "machine": "x86_64", "started_at": "now", "commit": "abc", "wall_s": 60.0}


def test_a_small_run_says_it_is_small_and_the_json_has_the_issue_keys(tmp_path: Path) -> None:
    write_report(_result(200_000), tmp_path)
    md = (tmp_path / "pool-10m.md").read_text()
    data = json.loads((tmp_path / "pool-10m.json").read_text())
    assert "A small run: 200,000 vectors" in md and data["vectors"] == 200_000 and data["small_run"] is True
    for key in ("vectors", "single.p50_ms", "recall_at_50", "rss_bytes", "disk_bytes", "cold_start_s",
                "deleted_still_returned", "ingest_vectors_per_s"):
        assert key in data and data[key] == headline(data)[key]
    write_report(_result(10_000_000), tmp_path)
    assert "small run" not in (tmp_path / "pool-10m.md").read_text()


# --- the real-embedding sanity set (t3ar_bench.retrieval.pool_real) ---

def _unit(n: int, dim: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_embeddings_load_from_files_and_folders_with_exact_repeats_dropped(tmp_path: Path) -> None:
    from t3ar_bench.retrieval.pool_real import load_embeddings

    a, b = _unit(800, 16, 0), _unit(700, 16, 1)
    (tmp_path / "set").mkdir()
    np.save(tmp_path / "set" / "a.npy", a)
    np.save(tmp_path / "set" / "b.npy", b)
    np.save(tmp_path / "c.npy", a[:100])  # the same rows again: dropped
    x, source = load_embeddings([tmp_path / "set", tmp_path / "c.npy", tmp_path / "set" / "a.npy"])
    assert x.shape == (1500, 16) and x.dtype == np.float32
    assert source == {"files": 3, "folders": [str(tmp_path), str(tmp_path / "set")], "vectors_loaded": 1600,
                      "exact_duplicates_dropped": 100, "dim": 16}
    assert np.allclose(np.linalg.norm(x, axis=1), 1, atol=1e-6)
    assert np.allclose(x, np.unique(np.concatenate([a, b]), axis=0), atol=1e-6)


def test_a_quoted_glob_pattern_picks_one_models_files(tmp_path: Path) -> None:
    from t3ar_bench.retrieval.pool_real import RealEmbeddingsError, embedding_files

    for name in ("m1-a.npy", "m1-b.npy", "m2-a.npy"):
        np.save(tmp_path / name, _unit(2, 4, 0))
    assert embedding_files([tmp_path / "m1-*.npy"]) == [tmp_path / "m1-a.npy", tmp_path / "m1-b.npy"]
    with pytest.raises(RealEmbeddingsError, match="no file matches this pattern"):
        embedding_files([tmp_path / "m3-*.npy"])
    with pytest.raises(RealEmbeddingsError, match="no such file or directory"):
        embedding_files([tmp_path / "nothing.npy"])


@pytest.mark.parametrize(("arrays", "message"), [
    ({"a.npy": _unit(800, 16, 0), "b.npy": _unit(800, 8, 1)}, "mix dimensions [8, 16]"),
    ({"a.npy": _unit(1500, 16, 0) * 2}, "1500 of 1500 rows are not L2-normalised"),
    ({"a.npy": _unit(999, 16, 0)}, "999 embeddings in 1 file(s): at least 1000"),
    ({"a.npy": _unit(1500, 16, 0)[0]}, "expected a 2-D float array"),
    ({"a.npy": np.ones((1500, 16), np.int64)}, "expected a 2-D float array"),
    ({"a.txt": _unit(1500, 16, 0)}, "not a .npy file"),
    ({}, "no .npy files in this directory"),
])
def test_what_is_not_one_set_of_normalised_embeddings_is_refused(tmp_path: Path, arrays: dict[str, np.ndarray],
                                                                  message: str) -> None:
    from t3ar_bench.retrieval.pool_real import RealEmbeddingsError, load_embeddings

    for name, a in arrays.items():
        with (tmp_path / name).open("wb") as f:
            np.save(f, a)
    target = [tmp_path / "a.txt"] if "a.txt" in arrays else [tmp_path]
    with pytest.raises(RealEmbeddingsError, match=re.escape(message)):
        load_embeddings(target)


def test_recall_counts_a_tie_at_the_kth_score_and_pq_m_divides_the_dimension() -> None:
    from t3ar_bench.retrieval.pool_real import pq_m_for, recall_ties

    # query 0 got 3 results, 2 above the 3rd exact score and one a near-copy tied with it; query 1 one miss
    assert recall_ties([np.array([0.9, 0.8, 0.7 - 1e-7]), np.array([0.9, 0.8, 0.1])],
                       np.array([0.7, 0.7]), k=3) == pytest.approx(5 / 6)
    assert pq_m_for(512, 64) == 64 and pq_m_for(1280, 64) == 64 and pq_m_for(100, 64) == 50 and pq_m_for(7, 64) == 7


def test_the_sanity_set_builds_the_ivfpq_index_and_measures_it_against_exact_search(tmp_path: Path) -> None:
    from t3ar_bench.retrieval.pool_real import bench_real

    x = _unit(3000, 32, 2)
    src = {"files": 1, "folders": ["x"], "vectors_loaded": 3000, "exact_duplicates_dropped": 0, "dim": 32}
    # every list probed and every vector re-ranked exactly: the index must find the exact top 50
    full = bench_real(x, tmp_path / "a", n_queries=40, nprobe=1 << 20, pq_m=64, rerank=64, source=src)
    assert full["measured"] and full["index"]["type"] == "ivfpq" and full["index"]["pq_m"] == 32
    assert full["vectors"] == 2960 and full["queries"] == 40 and full["index"]["nlist"] == 64
    assert full["recall_at_50"] == full["recall_at_50_ids"] == 1.0
    assert full["single"]["n"] == full["exact_single"]["n"] == 40
    # one list of 64 probed: the index sees a small part of the set, and says so
    narrow = bench_real(x, tmp_path / "b", n_queries=40, nprobe=1, pq_m=8, rerank=1, source=src)
    assert narrow["recall_at_50_ids"] <= narrow["recall_at_50"] + 1e-9 and narrow["recall_at_50"] < 0.5


def test_the_sanity_set_leaves_the_process_thread_count_as_it_found_it(tmp_path: Path) -> None:
    """Its one-thread timing sets the calling thread's OpenMP thread count: a function other code calls in-process
    leaves the process as it found it (every later faiss call of the thread ran on one thread)."""
    import faiss
    import torch

    from t3ar_bench.retrieval.pool_real import bench_real

    before = (faiss.omp_get_max_threads(), torch.get_num_threads())
    src = {"files": 1, "folders": ["x"], "vectors_loaded": 3000, "exact_duplicates_dropped": 0, "dim": 32}
    bench_real(_unit(3000, 32, 2), tmp_path, n_queries=10, nprobe=4, pq_m=8, rerank=2, source=src)
    assert (faiss.omp_get_max_threads(), torch.get_num_threads()) == before


def test_the_report_has_a_section_of_its_own_for_the_real_embeddings(tmp_path: Path) -> None:
    p = {"p50_ms": 1.5, "p99_ms": 3.0}
    real = {"measured": True, "files": 15, "folders": ["/e"], "vectors_loaded": 29_000, "exact_duplicates_dropped": 9,
            "dim": 1280, "vectors": 28_791, "queries": 200, "k": 50, "build_s": 20.0, "recall_at_50": 0.97,
            "recall_at_50_ids": 0.95, "single": p, "exact_single": p, "timing": "in-process",
            "index": {"type": "ivfpq", "nlist": 128, "nprobe": 32, "pq_m": 64, "rerank_factor": 4}}
    write_report({**_result(200_000), "real_embeddings": real}, tmp_path)
    md = (tmp_path / "pool-10m.md").read_text()
    assert "## Real embeddings: a sanity check at small scale" in md
    assert "**28,791 real 1280-d embeddings** (29,000 rows from 15 .npy file(s) in `/e`" in md
    assert "| `recall_at_50` (ties at the 50th score count) | 0.970 | 1 |" in md
    assert json.loads((tmp_path / "pool-10m.json").read_text())["real_embeddings"] == real
    write_report(_result(200_000), tmp_path)
    assert "Not measured in this run: none here." in (tmp_path / "pool-10m.md").read_text()


def test_bad_real_embeddings_stop_the_command_before_the_run(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from t3ar_bench.retrieval.pool10m_cmd import pool

    np.save(tmp_path / "few.npy", _unit(10, 8, 0))
    res = CliRunner().invoke(pool, ["--vectors", "10000", "--real-embeddings", str(tmp_path / "few.npy"),
                                    "--work-dir", str(tmp_path / "work"), "--out", str(tmp_path / "out")])
    assert res.exit_code == 2 and "10 embeddings in 1 file(s): at least 1000" in res.output
    assert not (tmp_path / "work").exists() and not (tmp_path / "out").exists()

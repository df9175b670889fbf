"""``t3ar bench pool``'s pure parts: the streamed exact top-k, the default nlist, recall and the report's labels."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

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

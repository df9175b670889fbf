"""The pool backend module (issue 12): no pymilvus; an unreachable URI: test_retriever_backends.py."""

from __future__ import annotations

import sys

import pytest

from t3ar_services.retriever import backend


def test_missing_pymilvus_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pymilvus", None)  # import pymilvus -> ImportError
    with pytest.raises(backend.MilvusUnavailableError, match=r"pip install 't3ar\[milvus\]'.*BACKEND=faiss"):
        backend.connect("http://127.0.0.1:9", None)


def test_uri_kinds() -> None:
    assert backend.local_file("/data/pool/milvus.db") == "/data/pool/milvus.db"
    assert backend.local_file("http://milvus:19530") is None
    assert backend.default_collection("3fa9c1") == "t3ar_pool_3fa9c1"


def test_backends_section_of_the_retrieval_report() -> None:
    from t3ar.bench.retrieval.report import _backends

    side = {"start_s": 1.0, "ingest_vectors_per_s": 1000.0, "qps": 50.0,
            "single": {"p50_ms": 5.0, "p99_ms": 9.0, "max_ms": 9.5, "n": 10},
            "delete": {"p50_ms": 3.0, "p99_ms": 8.0, "max_ms": 8.0, "n": 10}, "deleted_returned_after_2xx": 0}
    b = {"vectors": 1000, "dim": 512, "k": 50, "batch": 256, "milvus_uri": "milvus-lite", "same_top1_share": 1.0,
         "faiss": side, "milvus": {**side, "deleted_returned_after_2xx": 2}}
    text = "\n".join(_backends({"backends": b}))
    assert "faiss vs milvus-lite, 1,000 vectors" in text
    assert "| deleted ids returned after the 2xx (goal 0) | 0 | 2 |" in text
    assert "**missed**" in text
    assert "A Milvus server was not measured in this run: no Milvus server was given" in text
    assert "Skipped: no pymilvus." in "\n".join(_backends({"backends": {"skipped": "no pymilvus"}}))
    assert _backends({}) == []
    # issue 29: a real server's column, and a backends run made apart from the full run, said as such
    sep = {**b, "milvus": side, "milvus_server": {**side, "qps": 7.0}, "milvus_server_version": "v2.3.5-lite",
           "measured_at": "2026-11-26 11:00:00", "command": "t3ar bench retrieval --only backends --milvus-uri URI",
           "load_average_start": [2.6, 2.0, 2.0], "wall_seconds": 300.0}
    text = "\n".join(_backends({"backends": b, "backends_separate": sep, "machine": {"cpus": 2}}))
    assert "| | faiss | milvus-lite | Milvus server v2.3.5-lite |" in text
    assert "| search QPS, batches of 256 | 50 | 50 | 7 |" in text
    assert "Measured on 2026-11-26 11:00:00 by `t3ar bench retrieval --only backends --milvus-uri URI`" in text
    assert "the machine shared with other jobs" in text
    assert text.count("**missed**") == 1  # the full run's table; the separate one met its goal

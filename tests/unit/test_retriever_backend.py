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
    from t3ar_bench.retrieval.report import _backends

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


def test_milvus_index_and_search_parameters_follow_the_configuration() -> None:
    hnsw = backend.MilvusConfig()
    assert (hnsw.index, hnsw.consistency) == ("HNSW", "Session")
    assert hnsw.build_params() == {"M": 16, "efConstruction": 200}
    assert hnsw.search_params(50) == {"metric_type": "IP", "params": {"ef": 128}}
    assert hnsw.search_params(400)["params"] == {"ef": 400}  # Milvus refuses ef < k
    ivf = backend.MilvusConfig(index="IVF_FLAT", ivf_nlist=256, ivf_nprobe=8)
    assert ivf.build_params() == {"nlist": 256} and ivf.search_params(50)["params"] == {"nprobe": 8}
    assert backend.MilvusConfig(index="FLAT").build_params() == {}


def test_settings_make_the_milvus_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    from t3ar_services.retriever.settings import RetrieverSettings

    monkeypatch.setenv("T3AR_RETRIEVER_MILVUS_INDEX", "IVF_FLAT")
    monkeypatch.setenv("T3AR_RETRIEVER_MILVUS_IVF_NPROBE", "64")
    monkeypatch.setenv("T3AR_RETRIEVER_MILVUS_CONSISTENCY", "Bounded")
    config = RetrieverSettings(auth_disabled=True).milvus_config
    assert (config.index, config.ivf_nprobe, config.consistency) == ("IVF_FLAT", 64, "Bounded")
    monkeypatch.setenv("T3AR_RETRIEVER_MILVUS_CONSISTENCY", "Eventually")
    with pytest.raises(ValueError, match="milvus_consistency"):
        RetrieverSettings(auth_disabled=True)


def test_the_backends_benchmark_s_exact_top_k_is_the_brute_force_answer() -> None:
    import numpy as np

    from t3ar_bench.retrieval.backends import exact_top_k

    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((250, 8)).astype(np.float32)
    queries = rng.standard_normal((5, 8)).astype(np.float32)
    chunks = {0: vecs[:100], 100: vecs[100:200], 200: vecs[200:]}
    want = np.argsort(-(queries @ vecs.T), axis=1)[:, :7] + 1  # seqs are 1-based
    assert (exact_top_k(chunks, queries, 7) == want).all()


def test_the_backends_benchmark_names_the_milvus_index_the_retrievers_inherit() -> None:
    from t3ar_bench.retrieval.backends import milvus_index_description

    assert milvus_index_description({}) == "HNSW (M 16, efConstruction 200, ef 128), Session consistency"
    assert milvus_index_description({"T3AR_RETRIEVER_MILVUS_INDEX": "IVF_FLAT", "T3AR_RETRIEVER_MILVUS_IVF_NPROBE": "8",
                                     "T3AR_RETRIEVER_MILVUS_CONSISTENCY": "Strong"}) == \
        "IVF_FLAT (nlist 1024, nprobe 8), Strong consistency"


def test_a_milvus_read_that_has_not_caught_up_is_asked_again_at_strong() -> None:
    """After a Milvus restart a Session read can come back with fewer results than the collection holds (the query
    node still replaying its log): those queries are asked again at Strong, which waits for it."""
    import threading

    import numpy as np

    from t3ar_services.retriever.backend import MilvusConfig, MilvusIndex

    class Client:
        def __init__(self) -> None:
            self.levels: list[str] = []

        def search(self, collection: str, *, data: list, limit: int, consistency_level: str, **kw: object) -> list:
            self.levels.append(consistency_level)
            hits = [{"distance": 0.9, "seq": 1}, {"distance": 0.8, "seq": 2}][:limit]
            return [[] if consistency_level == "Session" and i == 0 else hits for i in range(len(data))]

    index = object.__new__(MilvusIndex)  # the search path alone, over a fake client (no server)
    index.client, index.collection, index.config, index.present = Client(), "c", MilvusConfig(), None
    index._count_lock, index._ghosts, index._count = threading.Lock(), set(), 2
    index.filtered = index.stale_reads = 0
    scores, seqs = index.search(np.ones((2, 4), np.float32), 2)
    assert [s.tolist() for s in seqs] == [[1, 2], [1, 2]] and index.stale_reads == 1
    assert index.client.levels == ["Session", "Strong"]
    index.client.levels.clear()
    index._count = 1  # the collection holds one row: an answer of one is whole, nothing is asked again
    index.client.search = lambda collection, *, data, limit, consistency_level, **kw: (  # type: ignore[method-assign]
        index.client.levels.append(consistency_level) or [[{"distance": 0.9, "seq": 1}] for _ in data])
    index.search(np.ones((3, 4), np.float32), 2)
    assert index.client.levels == ["Session"] and index.stale_reads == 1

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

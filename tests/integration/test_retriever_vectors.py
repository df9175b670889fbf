"""Vectors-only pools (no embedder: what the benchmark uses) with the IVF index option, across restarts."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from t3ar.clients.retriever_errors import RetrieverInputError

if TYPE_CHECKING:
    from conftest import RetrieverProcess

ENV = {"T3AR_RETRIEVER_EMBEDDER": "none", "T3AR_RETRIEVER_VECTOR_DIM": "16",
       "T3AR_RETRIEVER_VECTOR_IDENTITY": "synthetic-16", "T3AR_RETRIEVER_INDEX_TYPE": "ivf",
       "T3AR_RETRIEVER_IVF_NLIST": "16", "T3AR_RETRIEVER_IVF_NPROBE": "16", "T3AR_RETRIEVER_IVF_TRAIN_MIN": "1000"}


def test_ivf_vectors_pool_add_search_delete_restart(tmp_path: Path,
                                                    retriever_factory: Callable[..., RetrieverProcess]) -> None:
    data = tmp_path / "pool"
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((3000, 16)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    rp = retriever_factory(data, ENV)
    with rp.client() as c:
        assert c.stats().index.type == "flat"  # empty pool: nothing to train IVF on yet
        ids = c.add_vectors(vecs[:2000], identity="synthetic-16", source="a")
        ids += c.add_vectors(vecs[2000:], identity="synthetic-16", source="b")
        assert len(set(ids)) == 3000
        deadline = time.monotonic() + 60  # trained in the background once the pool passed IVF_TRAIN_MIN
        while (st := c.stats()).index.type != "ivf" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert st.index.type == "ivf" and st.index.trained_on in (2000, 3000)
        assert [row[0] for row in c.search(vecs[:50], k=1).ids] == ids[:50]
        with pytest.raises(RetrieverInputError, match="out of range"):
            c.search(vecs[:1], k=100_000)
        with pytest.raises(RetrieverInputError, match="dim 16"):
            c.search(vecs[:1, :8], k=1)
    rp.stop(signal.SIGKILL)
    rp = retriever_factory(data, ENV)
    with rp.client() as c:
        st = c.stats()
        assert st.index.type == "ivf" and st.index.nlist == 16 and st.count == 3000
        res = c.search(vecs[:50], k=1)
        assert [row[0] for row in res.ids] == ids[:50]  # nprobe = nlist: exact
        assert all(set(row) <= set(ids[2000:]) for row in c.search(vecs[:5], k=10, source="b").ids)
        c.delete_many(ids[:10])
        assert not {i for row in c.search(vecs[:10], k=20).ids for i in row} & set(ids[:10])
    rp.stop(signal.SIGTERM)
    rp = retriever_factory(data, ENV)
    with rp.client() as c:
        st = c.stats()
        assert st.repairs == [] and st.index.type == "ivf" and st.count == 2990
        assert not {i for row in c.search(vecs[:10], k=20).ids for i in row} & set(ids[:10])
        assert c.search(vecs[10:11], k=1).ids == [[ids[10]]]

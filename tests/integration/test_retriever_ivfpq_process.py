"""The compressed index (``ivfpq``) in a real retriever process: trained in the background, deletes never come
back (after kill -9 too), a clean restart loads the saved index without retraining, deleted rows leave the
float16 file (also those a kill between a delete's commit and its zeroing left there)."""

from __future__ import annotations

import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from conftest import RetrieverProcess

D = 32
ENV = {"T3AR_RETRIEVER_EMBEDDER": "none", "T3AR_RETRIEVER_VECTOR_DIM": str(D),
       "T3AR_RETRIEVER_VECTOR_IDENTITY": f"synthetic-{D}", "T3AR_RETRIEVER_INDEX_TYPE": "ivfpq",
       "T3AR_RETRIEVER_IVF_NLIST": "16", "T3AR_RETRIEVER_IVF_NPROBE": "16", "T3AR_RETRIEVER_IVF_TRAIN_MIN": "1000",
       "T3AR_RETRIEVER_PQ_M": "8", "T3AR_RETRIEVER_RERANK_FACTOR": "8"}


def _vectors(n: int) -> np.ndarray:
    g = np.random.default_rng(0)
    centres = g.standard_normal((40, D)).astype(np.float32)
    v = centres[g.integers(0, 40, n)] + 0.35 * g.standard_normal((n, D)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _self_found(c: object, q: np.ndarray, ids: list[str]) -> float:
    """The share of queries (stored vectors) whose own id is in their top 10 (PQ codes are approximate; the
    re-ranking makes the answer exact among the candidates)."""
    rows = c.search(q, k=10).ids  # type: ignore[attr-defined]
    return sum(i in row for i, row in zip(ids, rows, strict=True)) / len(ids)


def _found(c: object, q: np.ndarray, k: int = 50) -> set[str]:
    return {i for row in c.search(q, k=k).ids for i in row}  # type: ignore[attr-defined]


def test_ivfpq_pool_deletes_stay_deleted_across_kill9_and_a_clean_restart_loads_the_saved_index(
        tmp_path: Path, retriever_factory: Callable[..., RetrieverProcess]) -> None:
    data = tmp_path / "pool"
    vecs = _vectors(3000)
    rp = retriever_factory(data, ENV)
    with rp.client() as c:
        ids = c.add_vectors(vecs[:2000], identity=f"synthetic-{D}")
        deadline = time.monotonic() + 60
        while (st := c.stats()).index.type != "ivfpq" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert st.index.type == "ivfpq" and st.index.nlist == 16
        ids += c.add_vectors(vecs[2000:], identity=f"synthetic-{D}")
        assert _self_found(c, vecs[:50], ids[:50]) >= 0.95
        assert _self_found(c, vecs[2500:2550], ids[2500:2550]) >= 0.95  # added after training
        c.delete_many(ids[:10])
        assert not _found(c, vecs[:10]) & set(ids[:10])
    rp.stop(signal.SIGKILL)  # no saved index: the next start rebuilds from the database
    # and as if the kill had come between a delete's commit and its zeroing: the row back, recorded to zero
    seq = int(ids[0].rsplit("-", 1)[1])
    with open(data / "vectors.f16", "r+b") as f:
        f.seek(seq * D * 2)
        f.write(vecs[0].astype(np.float16).tobytes())
    with sqlite3.connect(data / "pool.sqlite3") as db:
        db.execute("INSERT INTO vectors_to_zero VALUES (?)", (seq,))
    rp = retriever_factory(data, ENV)
    with rp.client() as c:
        st = c.stats()
        assert st.index.type == "ivfpq" and st.count == 2990 and any("rebuilt" in r for r in st.repairs)
        assert any("zeroed the float16 rows of 1 deleted item(s)" in r for r in st.repairs)
        assert not _found(c, vecs[:10]) & set(ids[:10])
        c.delete_many(ids[10:20])
        assert _self_found(c, vecs[20:70], ids[20:70]) >= 0.95
    assert rp.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
    assert (data / "index" / "faiss.index.marker.json").exists()
    rows = (data / "vectors.f16").read_bytes()  # float16 storage, the default for a new ivfpq pool
    assert all(vecs[i].astype(np.float16).tobytes() not in rows for i in range(20))  # deleted rows zeroed
    assert vecs[25].astype(np.float16).tobytes() in rows
    rp = retriever_factory(data, ENV)
    with rp.client() as c:
        st = c.stats()
        assert st.repairs == [] and st.index.type == "ivfpq"  # loaded, not retrained
        assert st.count == 2980 and st.index.trained_on == 2990  # trained at the rebuild after kill -9
        assert not _found(c, vecs[:20]) & set(ids[:20])
        assert _self_found(c, vecs[20:70], ids[20:70]) >= 0.95

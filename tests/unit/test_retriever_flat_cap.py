"""Backpressure before the first IVF training: a pool of a trained kind holds at most ``flat_cap`` vectors on its
exact float32 index; adds beyond wait for the training's swap, then answer 503 with a ``Retry-After``."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from retriever_kit import pool_settings, unit_vectors

from t3ar_services.retriever.errors import ERRORS, NotReadyError
from t3ar_services.retriever.index import IndexConfig, VectorIndex
from t3ar_services.retriever.pool import Pool
from t3ar_services.retriever.startup import load_index, open_pool
from t3ar_services.retriever.training import IndexTrainer, flat_cap

D = 32
CHUNK = 500


def _unit(n: int, seed: int) -> np.ndarray:
    return unit_vectors(n, D, seed)


def _pool(tmp_path: Path, **kw: object) -> Pool:
    args: dict[str, object] = {"index_type": "ivfpq", "ivf_nlist": 16, "ivf_nprobe": 16, "pq_m": 8,
                               "rerank_factor": 8, "ivf_train_min": 1000, **kw}
    pool, _ = open_pool(pool_settings(tmp_path, D, **args), None, None)
    load_index(pool)
    return pool


def _trainer(pool: Pool, batches: object) -> IndexTrainer:
    trainer = IndexTrainer(lambda: pool.index if isinstance(pool.index, VectorIndex) else None,
                           pool.info.index_config, batches, wanted=pool.index_grew, interval=0.05)  # type: ignore[arg-type]
    trainer.start()
    pool.trainer = trainer
    return trainer


def test_the_cap_is_twice_train_min_or_as_configured_and_never_below_what_a_training_needs() -> None:
    assert flat_cap(IndexConfig("flat", train_min=1000)) is None
    assert flat_cap(IndexConfig("ivfpq", train_min=1000)) == 2000
    assert flat_cap(IndexConfig("ivf", train_min=1000, flat_max=5000)) == 5000
    assert flat_cap(IndexConfig("ivf", train_min=1000, flat_max=10)) == 2000  # under 2 x train_min: raised
    assert flat_cap(IndexConfig("ivfpq", train_min=1)) == 512  # a PQ codebook needs 256 points to train


def test_adds_over_the_cap_wait_for_the_first_training_so_the_flat_index_stays_bounded(tmp_path: Path) -> None:
    pool = _pool(tmp_path)
    cap = flat_cap(pool.info.index_config)
    assert cap == 2000

    def slow() -> Iterator[tuple[np.ndarray, np.ndarray]]:  # a training far slower than the adds (a 10 M ingest)
        time.sleep(1.0)
        yield from pool.store.iter_vectors(D)

    trainer = _trainer(pool, slow)
    vecs = _unit(8 * CHUNK, 0)
    flat_counts: list[int] = []
    try:
        for lo in range(0, len(vecs), CHUNK):
            pool.add_vectors(vecs[lo:lo + CHUNK], source="s", metadata={})
            index = pool.index
            assert index is not None
            if index.kind == "flat":
                flat_counts.append(index.count)
    finally:
        trainer.stop()
    assert pool.index is not None and pool.index.kind == "ivfpq" and pool.index.count == len(vecs)
    assert trainer.builds >= 1
    # an add starts only below the cap, so the flat index ends at most one request over it (without the hold
    # all 4,000 vectors were added to the flat index before the slow training swapped in)
    assert max(flat_counts) < cap + CHUNK
    assert pool.search(vecs[:3], 1)[0][0][0] == pool.format_id(1)
    pool.store.close()


def test_an_add_over_the_cap_answers_503_with_retry_after_while_the_training_fails(tmp_path: Path) -> None:
    pool = _pool(tmp_path, ivf_flat_wait_s=0.3)

    def broken() -> Iterable[tuple[np.ndarray, np.ndarray]]:
        raise OSError("disk read failed")

    vecs = _unit(5 * CHUNK, 1)
    pool.add_vectors(vecs[:4 * CHUNK], source="s", metadata={})  # at the cap before any trainer runs
    trainer = _trainer(pool, broken)
    try:
        deadline = time.monotonic() + 30
        while trainer.last_error is None and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(NotReadyError, match="disk read failed") as err:
            pool.add_vectors(vecs[4 * CHUNK:], source="s", metadata={})
        assert err.value.retry_after == 10 and "T3AR_RETRIEVER_IVF_FLAT_MAX: 2,000" in str(err.value)
        assert pool.index is not None and pool.index.count == 4 * CHUNK  # nothing half-added
    finally:
        trainer.stop()
    pool.add_vectors(vecs[4 * CHUNK:], source="s", metadata={})  # no trainer running: nothing would lift the hold
    assert pool.index.count == 5 * CHUNK
    pool.store.close()


def test_a_503_carries_the_errors_own_retry_after_or_the_services_default() -> None:
    app = FastAPI()
    ERRORS.install(app)

    @app.get("/own")
    def own() -> None:
        raise NotReadyError("training", retry_after=10)

    @app.get("/default")
    def default() -> None:
        raise NotReadyError("loading")

    with TestClient(app) as c:
        r = c.get("/own")
        assert r.status_code == 503 and r.headers["retry-after"] == "10" and r.json()["error"]["code"] == "not_ready"
        assert c.get("/default").headers["retry-after"] == "1"


def test_the_cap_is_checked_for_count_plus_batch(tmp_path: Path) -> None:
    """N10 (issue 50): the cap was checked before an add, not for count plus batch: one request took the exact
    index from 1,999 to 151,999 vectors. A batch that would pass the cap waits for the first training when one
    can start (the pool holds what a training needs), and is refused, nothing added, when none can."""
    from t3ar_services.retriever.errors import PayloadTooLargeError

    pool = _pool(tmp_path)  # cap 2,000; a training starts from 1,000
    vecs = _unit(6 * CHUNK, 2)
    with pytest.raises(PayloadTooLargeError, match="at most 2,000 now") as err:
        pool.add_vectors(vecs, source="s", metadata={})  # 3,000 onto an empty exact index: no training can start
    assert "T3AR_RETRIEVER_IVF_FLAT_MAX" in str(err.value)
    assert pool.index is not None and pool.index.count == 0 and pool.store.count() == 0
    pool.add_vectors(vecs[:1999], source="s", metadata={})

    def slow() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        time.sleep(1.0)
        yield from pool.store.iter_vectors(D)

    trainer = _trainer(pool, slow)
    try:
        pool.add_vectors(vecs[1999:], source="s", metadata={})  # 1,001 more: waits for the training's swap
    finally:
        trainer.stop()
    assert pool.index is not None and pool.index.kind == "ivfpq" and pool.index.count == len(vecs)
    pool.store.close()

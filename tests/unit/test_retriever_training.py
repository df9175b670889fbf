"""Background IVF (re)training with an atomic swap, and exact search on a torch device (CPU torch here)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from retriever_kit import restarted

from t3ar.errors import DeviceUnavailableError
from t3ar.torch_search import TorchFlat
from t3ar_services.retriever.index import IndexConfig, VectorIndex
from t3ar_services.retriever.settings import RetrieverSettings
from t3ar_services.retriever.startup import load_index, open_pool
from t3ar_services.retriever.training import IndexTrainer, nlist_to_train, rebuild_ivf

D = 16


def _unit(n: int, seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((n, D)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _exact(store: dict[int, np.ndarray], q: np.ndarray, k: int) -> list[list[int]]:
    ids = np.array(sorted(store))
    mat = np.stack([store[i] for i in ids])
    return [ids[np.argsort(-row, kind="stable")[:k]].tolist() for row in q @ mat.T]


CFG = IndexConfig("ivf", nlist=8, nprobe=8, train_min=500)  # nprobe = nlist: the IVF answers equal exact search


def test_swap_keeps_search_exact_and_deletes_during_the_build_never_come_back() -> None:
    vecs = _unit(3000, 0)
    store = {i + 1: vecs[i] for i in range(2000)}  # the "database": seq -> vector
    idx = VectorIndex.build(D, IndexConfig("flat"), [(np.arange(1, 2001), vecs[:2000])])
    assert nlist_to_train(idx, CFG) == 8 and nlist_to_train(idx, IndexConfig("flat")) is None
    q = _unit(20, 1)
    assert [r.tolist() for r in idx.search(q, 5)[1]] == _exact(store, q, 5)  # before: flat, exact

    in_pass2, release = threading.Event(), threading.Event()
    passes = []

    def batches() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        snap = dict(store)  # one read snapshot per pass
        passes.append(len(snap))
        ids = np.array(sorted(snap))
        half = len(ids) // 2
        yield ids[:half], np.stack([snap[i] for i in ids[:half]])
        if len(passes) == 2:
            in_pass2.set()
            release.wait(10)
        yield ids[half:], np.stack([snap[i] for i in ids[half:]])

    result: list[bool] = []
    builder = threading.Thread(target=lambda: result.append(rebuild_ivf(idx, CFG, 8, batches)))
    builder.start()
    assert in_pass2.wait(10)
    # during the build: writes arrive, searches answer from the live (flat) index
    victims = [5, 1500, 1999]
    for v in victims:
        del store[v]
    idx.remove(victims)
    assert idx.compact() == 3  # physically gone from the old index: only the journal remembers them
    new_ids = np.arange(2001, 2101)
    store.update({int(i): vecs[i - 1] for i in new_ids})
    idx.add(new_ids, vecs[2000:2100])
    assert idx.kind == "flat" and [r.tolist() for r in idx.search(q, 5)[1]] == _exact(store, q, 5)
    release.set()
    builder.join(10)
    assert result == [True] and idx.kind == "ivf" and idx.nlist == 8 and idx.trained_on == 2000
    # after: the snapshot held the victims, the tombstones still hide them; the late adds were replayed
    assert idx.count == len(store) == 2097 and idx.tombstones == 3
    assert [r.tolist() for r in idx.search(q, 5)[1]] == _exact(store, q, 5)
    for v in victims:
        assert v not in idx.search(vecs[v - 1:v], 50)[1][0].tolist()
    assert idx.search(vecs[2050:2051], 1)[1][0].tolist() == [2051]
    assert idx.compact() == 3 and idx.count == 2097
    assert set(idx.live_ids().tolist()) == set(store)
    assert [r.tolist() for r in idx.search(q, 5)[1]] == _exact(store, q, 5)
    assert nlist_to_train(idx, CFG) is None  # not grown 2x since training


def test_a_failed_or_stopped_build_leaves_the_live_index_alone() -> None:
    vecs = _unit(600, 2)
    idx = VectorIndex.build(D, IndexConfig("flat"), [(np.arange(1, 601), vecs)])

    def broken() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        raise OSError("disk gone")
        yield  # pragma: no cover

    with pytest.raises(OSError):
        rebuild_ivf(idx, CFG, 8, broken)
    assert not rebuild_ivf(idx, CFG, 8, lambda: iter([(np.arange(1, 601), vecs)]), should_stop=lambda: True)
    idx.add(np.array([601]), _unit(1, 3))  # no journal left behind
    assert idx.kind == "flat" and idx.count == 601 and idx._journal is None


def test_trainer_thread_trains_once_large_enough_and_a_restart_loads_the_trained_index(tmp_path: Path) -> None:
    settings = RetrieverSettings(data_dir=tmp_path / "pool", auth_disabled=True, embedder="none",  # type: ignore[arg-type]
                                 vector_dim=D, vector_identity="t", index_type="ivf", ivf_nlist=8, ivf_nprobe=8,
                                 ivf_train_min=1000)
    pool, _ = open_pool(settings, None, None)
    load_index(pool)
    assert pool.index is not None and pool.index.kind == "flat"
    trainer = IndexTrainer(lambda: pool.index, pool.info.index_config,
                           lambda: pool.store.iter_vectors(D), wanted=pool.index_grew, interval=0.05)
    trainer.start()
    try:
        vecs = _unit(1500, 4)
        ids = pool.add_vectors(vecs[:900], source="s", metadata={})
        time.sleep(0.3)
        assert pool.index.kind == "flat"  # below the threshold: exact search
        ids += pool.add_vectors(vecs[900:], source="s", metadata={})
        deadline = time.monotonic() + 20
        while pool.index.kind != "ivf" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.index.kind == "ivf" and pool.index.trained_on == 1500 and trainer.builds == 1
        pool.delete(ids[:3], missing_ok=False)
        assert [r[0][0] for r in pool.search(vecs[3:6], 1)] == ids[3:6]
    finally:
        trainer.stop()
    pool = restarted(pool, settings)
    assert pool.index is not None and pool.index.kind == "ivf" and pool.info.repairs == []
    assert pool.index.trained_on == 1500 and pool.index.count == 1497
    hits = pool.search(vecs[:6], 10)
    assert not {i for row, _ in hits for i in row} & set(ids[:3]) and hits[3][0][0] == ids[3]
    pool.store.close()


def test_torch_flat_equals_faiss_flat_with_filters_adds_and_removes() -> None:
    vecs = _unit(1200, 5)
    seqs = np.arange(100, 1300, dtype=np.int64)
    ref = VectorIndex.build(D, IndexConfig("flat"), [(seqs[:1000], vecs[:1000])])
    dev = VectorIndex.build(D, IndexConfig("flat", device="cpu"), [(seqs[:1000], vecs[:1000])])
    for i in (ref, dev):
        i.add(seqs[1000:], vecs[1000:])
        i.remove(seqs[:50].tolist())
    q = _unit(30, 6)  # >= 20 queries: faiss' BLAS path; the mirror does the same matmul
    for kwargs in ({}, {"exclude": seqs[50:60].tolist()}, {"allowed": seqs[::3]}):
        rs, ri = ref.search(q, 7, **kwargs)  # type: ignore[arg-type]
        ds, di = dev.search(q, 7, **kwargs)  # type: ignore[arg-type]
        assert [r.tolist() for r in ri] == [r.tolist() for r in di]
        np.testing.assert_allclose(np.stack(rs), np.stack(ds), atol=1e-5)
    assert ref.compact() == dev.compact() == 50
    assert [r.tolist() for r in ref.search(q, 7)[1]] == [r.tolist() for r in dev.search(q, 7)[1]]
    assert dev._mirror is not None and dev._mirror.ntotal == 1150
    mirror = TorchFlat(D, torch.device("cpu"))
    assert mirror.search(q[:2], 3)[1].tolist() == [[-1] * 3] * 2  # empty: faiss' layout, all missing


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_search_device_without_cuda_is_a_clear_error() -> None:
    with pytest.raises(DeviceUnavailableError, match="CUDA is not available"):
        VectorIndex.build(D, IndexConfig("flat", device="cuda"), [(np.arange(1, 3), _unit(2, 7))])
    def dev(**kw: str) -> str | None:
        return RetrieverSettings(auth_disabled=True, **kw).search_device  # type: ignore[arg-type]

    assert dev(device="cuda") == "cuda" and dev(device="cuda", index_device="faiss") is None
    assert dev() is None and dev(index_device="cpu") == "cpu"
    with pytest.raises(ValueError, match="index_device"):
        dev(index_device="gpu")

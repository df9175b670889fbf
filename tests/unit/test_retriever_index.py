"""The retriever's faiss wrapper: ids, tombstones, filters, persistence, IVF, and the RW lock."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from t3ar_services.retriever import index as index_mod
from t3ar_services.retriever.index import IndexConfig, RWLock, VectorIndex


def _unit(n: int, d: int = 16, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


@pytest.fixture(params=["flat", "ivf", "flat-torch"])
def built(request: pytest.FixtureRequest) -> tuple[VectorIndex, np.ndarray, np.ndarray]:
    """Each index kind; ``flat-torch``: exact search by the TorchFlat mirror (on CPU torch here)."""
    vecs = _unit(800)
    seqs = np.arange(10, 810, dtype=np.int64)  # own ids, not positions
    kind, _, torch_dev = request.param.partition("-")
    cfg = IndexConfig(kind, nlist=8, nprobe=8, device="cpu" if torch_dev else None)  # type: ignore[arg-type]
    idx = VectorIndex.build(16, cfg, [(seqs[:500], vecs[:500]), (seqs[500:], vecs[500:])])
    assert idx.kind == kind and idx.device == ("cpu" if torch_dev else None)
    return idx, seqs, vecs


def test_search_returns_own_ids_best_first_and_never_minus_one(built: tuple[VectorIndex, np.ndarray,
                                                                             np.ndarray]) -> None:
    idx, seqs, vecs = built
    scores, ids = idx.search(vecs[:5], 3)
    assert [int(row[0]) for row in ids] == list(seqs[:5])
    assert all((np.diff(s) <= 1e-6).all() for s in scores)
    _, many = idx.search(vecs[:1], 5000)  # k larger than the index
    assert len(many[0]) == 800 and (many[0] >= 0).all()


def test_remove_is_immediate_and_compaction_keeps_results(built: tuple[VectorIndex, np.ndarray,
                                                                        np.ndarray]) -> None:
    idx, seqs, vecs = built
    idx.remove([int(seqs[0]), int(seqs[1])])
    assert idx.count == 798 and idx.tombstones == 2
    before = idx.search(vecs[:4], 5)[1]
    assert not {int(i) for row in before for i in row} & {int(seqs[0]), int(seqs[1])}
    assert all(len(row) == 5 for row in before)  # over-fetch fills k despite the tombstones
    assert idx.compact() == 2 and idx.tombstones == 0 and idx.count == 798
    after = idx.search(vecs[:4], 5)[1]
    assert [list(a) for a in after] == [list(b) for b in before]
    assert set(idx.live_ids().tolist()) == set(seqs[2:].tolist())


def test_exclude_and_allowed_filters(built: tuple[VectorIndex, np.ndarray, np.ndarray],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    idx, seqs, vecs = built
    _, ids = idx.search(vecs[:1], 3, exclude=[int(seqs[0])])
    assert int(seqs[0]) not in ids[0].tolist() and len(ids[0]) == 3
    allowed = seqs[400:420]
    _, ids = idx.search(vecs[:3], 5, allowed=allowed)
    assert all(set(row.tolist()) <= set(allowed.tolist()) and len(row) == 5 for row in ids)
    monkeypatch.setattr(index_mod, "SELECTOR_MIN_DROP", 3)  # many exclusions: faiss-side selector path
    drop = [int(s) for s in seqs[:10]]
    idx.remove(drop[:5])
    _, ids = idx.search(vecs[:10], 4, exclude=drop[5:])
    assert all(not set(row.tolist()) & set(drop) and len(row) == 4 for row in ids)


def test_save_and_load_round_trip(built: tuple[VectorIndex, np.ndarray, np.ndarray], tmp_path: Path) -> None:
    idx, seqs, vecs = built
    idx.remove([int(seqs[3])])
    path = tmp_path / "faiss.index"
    idx.save(path, {"generation": 7})
    loaded = VectorIndex.load(path, nprobe=8)
    assert loaded is not None
    new, marker = loaded
    assert marker == {"generation": 7} and new.kind == idx.kind and new.tombstones == 0
    assert set(new.live_ids().tolist()) == set(seqs.tolist()) - {int(seqs[3])}
    new.add(np.array([5000]), vecs[3:4])
    assert new.search(vecs[3:4], 1)[1][0].tolist() == [5000]
    assert VectorIndex.load(tmp_path / "missing.index", nprobe=1) is None


def test_ivf_falls_back_to_flat_without_training_data() -> None:
    assert VectorIndex.build(8, IndexConfig("ivf", nlist=4), []).kind == "flat"
    small = VectorIndex.build(16, IndexConfig("ivf", nlist=64, nprobe=64), [(np.arange(1, 101), _unit(100))])
    assert small.kind == "ivf" and small.nlist == 2  # 100 vectors train 100 // 39 lists


def test_add_rejects_wrong_dimension() -> None:
    idx = VectorIndex.build(16, IndexConfig(), [])
    with pytest.raises(ValueError, match="dim 8"):
        idx.add(np.array([1]), _unit(1, 8))


def test_rwlock_writer_waits_for_readers_and_blocks_new_ones() -> None:
    lock, events = RWLock(), []
    reader_in = threading.Event()

    def reader(tag: str, hold: float) -> None:
        with lock.read():
            events.append(f"{tag}+")
            reader_in.set()
            time.sleep(hold)
            events.append(f"{tag}-")

    def writer() -> None:
        with lock.write():
            events.append("w")

    r1 = threading.Thread(target=reader, args=("r1", 0.3))
    r1.start()
    reader_in.wait()
    w = threading.Thread(target=writer)
    w.start()
    time.sleep(0.05)
    r2 = threading.Thread(target=reader, args=("r2", 0.0))
    r2.start()
    for t in (r1, w, r2):
        t.join()
    assert events.index("r1-") < events.index("w") < events.index("r2+")

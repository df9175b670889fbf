"""The compressed index (``ivfpq``): IVF-PQ codes in RAM, exact re-ranking from float16 rows in a
file, deletes, compaction, background retraining, near-duplicates, and the saved index (stale or corrupt: rebuilt)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from retriever_kit import restarted

from t3ar_services.retriever.index import IndexConfig, VectorIndex
from t3ar_services.retriever.pool import Candidate
from t3ar_services.retriever.settings import RetrieverSettings
from t3ar_services.retriever.startup import VECTOR_FILE, load_index, open_pool, save_index
from t3ar_services.retriever.training import IndexTrainer, build_ivf_two_pass
from t3ar_services.retriever.vecfile import VectorFile

D = 32


def _unit(n: int, seed: int, centres: int = 40) -> np.ndarray:
    """Clustered unit vectors (neighbours exist, as in real embeddings)."""
    g = np.random.default_rng(seed)
    c = np.random.default_rng(99).standard_normal((centres, D)).astype(np.float32)
    v = c[g.integers(0, centres, n)] + 0.35 * g.standard_normal((n, D)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _recall(found: list[np.ndarray], base: np.ndarray, ids: np.ndarray, q: np.ndarray, k: int) -> float:
    exact = ids[np.argsort(-(q @ base.T), axis=1)[:, :k]]
    return float(np.mean([len(set(f.tolist()) & set(e.tolist())) / k for f, e in zip(found, exact, strict=True)]))


def _cfg(tmp_path: Path, **kw: object) -> IndexConfig:
    args: dict[str, object] = {"nlist": 16, "nprobe": 16, "pq_m": 8, "rerank": 8, "train_min": 1000,
                               "vector_file": tmp_path / "vectors.f16"}
    args.update(kw)
    return IndexConfig("ivfpq", **args)  # type: ignore[arg-type]


def test_vector_file_rows_by_seq_round_trip_in_float16_and_zero_on_delete(tmp_path: Path) -> None:
    vf = VectorFile(tmp_path / "v.f16", D)
    v = _unit(5, 0)
    vf.write(np.array([3, 1, 70000, 2, 9]), v)  # grows past one mapping step
    assert vf.rows > 70000
    got = vf.read(np.array([1, 3, 70000, 4, -1, 10**9]))
    assert np.abs(got[0] - v[1]).max() < 1e-3 and np.abs(got[1] - v[0]).max() < 1e-3
    assert np.abs(got[2] - v[2]).max() < 1e-3
    assert not got[3:].any()  # never written, negative, beyond the file: zeros
    vf.zero(np.array([3]))
    assert not vf.read(np.array([3])).any()
    vf.flush()
    vf.close()
    again = VectorFile(tmp_path / "v.f16", D)  # reopened: the rows are on disk
    assert np.abs(again.read(np.array([9]))[0] - v[4]).max() < 1e-3 and not again.read(np.array([3])).any()
    assert again.disk_bytes() < 70000 * D * 2  # sparse where no id was written
    reader = VectorFile(tmp_path / "v.f16", D)  # a second instance on the file (the index reading the store's rows)
    again.write(np.array([200_000]), v[:1])  # grows the file past the reader's mapping
    assert np.abs(reader.read(np.array([200_000]))[0] - v[0]).max() < 1e-3
    again.close()
    reader.close()


def test_ivfpq_reranks_to_exact_scores_and_high_recall_where_pq_alone_is_lower(tmp_path: Path) -> None:
    base, ids = _unit(4000, 1), np.arange(1, 4001)
    q = _unit(50, 2)
    idx = VectorIndex.build(D, _cfg(tmp_path), [(ids[:2000], base[:2000]), (ids[2000:], base[2000:])])
    assert idx.kind == "ivfpq" and idx.nlist == 16 and idx.vectors is not None and idx.count == 4000
    scores, found = idx.search(q, 10)
    assert _recall(found, base, ids, q, 10) >= 0.95
    for row_s, row_i, qq in zip(scores, found, q, strict=True):  # scores are the exact inner products (float16 rows)
        assert np.abs(row_s - base[row_i - 1] @ qq).max() < 2e-3
        assert (np.diff(row_s) <= 1e-6).all()
    idx.vectors = None  # codes alone: what re-ranking buys
    _, pq_only = idx.search(q, 10)
    assert _recall(pq_only, base, ids, q, 10) < _recall(found, base, ids, q, 10)


def test_ivfpq_deletes_filters_and_compaction(tmp_path: Path) -> None:
    base, ids = _unit(3000, 3), np.arange(1, 3001)
    idx = VectorIndex.build(D, _cfg(tmp_path), [(ids, base)])
    q = base[:20]  # each query is a stored vector: its own id comes first
    assert [int(r[0]) for r in idx.search(q, 5)[1]] == ids[:20].tolist()
    idx.remove(ids[:10].tolist())
    assert idx.vectors is not None and not idx.vectors.read(ids[:10]).any()  # the compact copy is gone at once
    for row in idx.search(q, 50)[1]:
        assert not set(row.tolist()) & set(ids[:10].tolist()) and len(row) == 50
    assert idx.compact() == 10 and idx.tombstones == 0 and idx.count == 2990
    for row in idx.search(q, 50, exclude=[11], allowed=ids[5:15])[1]:
        assert set(row.tolist()) <= set(ids[11:15].tolist())
    idx.add(np.array([5000]), base[:1])  # an add lands in the codes and in the file
    assert int(idx.search(base[:1], 1)[1][0][0]) == 5000


def test_a_rebuild_journals_seqs_only_and_replays_the_rows_from_the_vector_file(tmp_path: Path) -> None:
    """Adds during a rebuild are journaled without their vectors (the float16 rows hold them) and read back from
    the file at the swap: the new index finds them; one deleted meanwhile stays invisible."""
    base, ids = _unit(3000, 6), np.arange(1, 3001)
    cfg = _cfg(tmp_path)
    idx = VectorIndex.build(D, cfg, [(ids[:2000], base[:2000])])
    assert idx.kind == "ivfpq" and idx.vectors is not None
    idx.begin_rebuild()
    snapshot = [(ids[:2000], base[:2000])]
    new, seqs = build_ivf_two_pass(D, cfg, 16, 2000, lambda: iter(snapshot))
    idx.add(ids[2000:], base[2000:])  # during the build, after its snapshot
    idx.remove([3000])
    assert idx._journal is not None and all(vecs is None for _, vecs in idx._journal.adds)  # no float32 copy
    assert idx.finish_rebuild(new, seqs) == 1000 and idx.count == 2999
    found = idx.search(base[2000:2010], 1)[1]
    assert [int(r[0]) for r in found] == ids[2000:2010].tolist()  # replayed from the file, found first
    assert all(3000 not in row.tolist() for row in idx.search(base[2990:], 10)[1])


def _settings(tmp_path: Path, **kw: object) -> RetrieverSettings:
    args: dict[str, object] = {"data_dir": tmp_path / "pool", "auth_disabled": True, "embedder": "none",
                               "vector_dim": D, "vector_identity": "t", "index_type": "ivfpq", "ivf_nlist": 16,
                               "ivf_nprobe": 16, "pq_m": 8, "rerank_factor": 8, "ivf_train_min": 1000}
    args.update(kw)
    return RetrieverSettings(**args)  # type: ignore[arg-type]


def test_background_training_then_a_saved_index_loads_without_retraining(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    pool, _ = open_pool(settings, None, None)
    load_index(pool)
    assert pool.index is not None and pool.index.kind == "flat"
    trainer = IndexTrainer(lambda: pool.index, pool.info.index_config,  # type: ignore[arg-type,return-value]
                           lambda: pool.store.iter_vectors(D), wanted=pool.index_grew, interval=0.05)
    trainer.start()
    vecs = _unit(2000, 4)
    try:
        ids = pool.add_vectors(vecs[:1200], source="s", metadata={})
        deadline = time.monotonic() + 30
        while pool.index.kind != "ivfpq" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.index.kind == "ivfpq" and trainer.builds == 1
        ids += pool.add_vectors(vecs[1200:], source="s", metadata={})  # after training: codes + file rows
        pool.delete(ids[:3], missing_ok=False)
        assert [r[0][0] for r in pool.search(vecs[3:6], 1)] == ids[3:6]
        assert [r[0][0] for r in pool.search(vecs[1500:1503], 1)] == ids[1500:1503]
    finally:
        trainer.stop()
    pool = restarted(pool, settings)
    assert pool.index is not None and pool.index.kind == "ivfpq" and pool.info.repairs == []  # loaded, not rebuilt
    assert pool.index.trained_on == 1200 and pool.index.count == 1997
    hits = pool.search(vecs[:6], 10)
    assert not {i for row, _ in hits for i in row} & set(ids[:3]) and hits[3][0][0] == ids[3]
    assert pool.index.vectors is not None
    pool.store.close()


def _saved_pool(tmp_path: Path, storage: str) -> tuple[RetrieverSettings, np.ndarray, list[str]]:
    settings = _settings(tmp_path, vector_storage=storage)
    pool, _ = open_pool(settings, None, None)
    load_index(pool)
    vecs = _unit(1500, 5)
    ids = pool.add_vectors(vecs, source="s", metadata={})
    pool.store.close()
    pool, _ = open_pool(settings, None, None)
    load_index(pool)  # 1500 >= train_min: rebuilt as ivfpq
    assert pool.index is not None and pool.index.kind == "ivfpq"
    save_index(pool)
    pool.store.close()
    return settings, vecs, ids


@pytest.mark.parametrize("damage", ["corrupt-index", "stale-marker", "vector-file"])
def test_a_corrupt_or_stale_saved_index_is_rebuilt_never_trusted(tmp_path: Path, damage: str) -> None:
    # sqlite storage for the vector-file case: there index/vectors.f16 is derived and checked (with float16 storage
    # the file is the pool's own vectors, the source of truth)
    settings, vecs, ids = _saved_pool(tmp_path, "sqlite" if damage == "vector-file" else "auto")
    index_dir = settings.data_dir / "index"
    if damage == "corrupt-index":
        path = index_dir / "faiss.index"
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "stale-marker":  # the database moved on (a write after the save that the marker missed)
        pool, _ = open_pool(settings, None, None)
        pool.store.delete([pool.require_seq(ids[0])])
        pool.store.close()
    else:  # the re-ranking rows no longer match the database
        vf = VectorFile(index_dir / VECTOR_FILE, D)
        seqs = np.array([int(i.rsplit("-", 1)[1]) for i in ids])
        vf.write(seqs, -vf.read(seqs))
        vf.close()
    pool, _ = open_pool(settings, None, None)
    load_index(pool)
    assert len(pool.info.repairs) == 1 and "rebuilt the index" in pool.info.repairs[0]
    assert pool.index is not None and pool.index.kind == "ivfpq"
    found = [row[0] for row, _ in pool.search(vecs[1:11], 1)]
    assert found == ids[1:11]
    if damage == "stale-marker":
        assert ids[0] not in {i for row, _ in pool.search(vecs[:1], 50) for i in row}
    pool.store.close()


def test_pq_m_that_does_not_divide_the_dimension_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="PQ_M=12 must divide"):
        open_pool(_settings(tmp_path, pq_m=12), None, None)


def test_near_duplicates_are_found_through_the_compressed_index(tmp_path: Path) -> None:
    settings = _settings(tmp_path, embedder="efficientnet_lite0", vector_dim=None, vector_identity=None)
    pool, _ = open_pool(settings, "ident", D)
    load_index(pool)
    vecs = _unit(1500, 6)
    pool.add_vectors(vecs, source="s", metadata={})
    pool.store.close()
    pool, _ = open_pool(settings, "ident", D)
    load_index(pool)
    assert pool.index is not None and pool.index.kind == "ivfpq"
    near = vecs[7] + 0.01 * _unit(1, 7)[0]
    near /= np.linalg.norm(near)
    far = np.random.default_rng(8).standard_normal(D).astype(np.float32)
    far /= np.linalg.norm(far)
    cands = [Candidate("near.png", b"a", "a" * 64, "image/png", 1, 1, near),
             Candidate("far.png", b"b", "b" * 64, "image/png", 1, 1, far)]
    out = pool.add(cands, source="s", metadata={}, policy="skip")
    assert out[0].status == "duplicate" and out[0].duplicate_of == pool.format_id(8) and out[0].score is not None
    assert out[0].score >= 0.98 and out[1].status == "added"
    pool.store.close()


def test_large_reads_and_writes_bypass_the_mapping_and_agree_with_it(tmp_path: Path) -> None:
    vf = VectorFile(tmp_path / "v.f16", D)
    v = _unit(6000, 9)
    seqs = np.r_[np.arange(1, 3001), np.arange(5000, 8000)]  # two runs, written out of order
    perm = np.random.default_rng(0).permutation(len(seqs))
    vf.write(seqs[perm], v[perm])
    big = vf.read(np.r_[seqs, [4000, 10**7, -3]])  # > MAPPED_READ_MAX rows: pread, zeros where nothing is
    small = vf.read(seqs[:100])  # the mapping
    assert np.abs(big[:6000] - v).max() < 1e-3 and not big[6000:].any()
    assert np.array_equal(small, big[:100])
    vf.zero(seqs[::2])
    assert not vf.read(seqs[::2]).any() and np.abs(vf.read(seqs[1::2]) - v[1::2]).max() < 1e-3
    vf.close()

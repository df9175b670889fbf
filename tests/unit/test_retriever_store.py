"""The retriever's SQLite store and pool logic (no HTTP, no embedder: synthetic vectors)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from t3ar_services.retriever.errors import NotFoundError, PoolIdentityError
from t3ar_services.retriever.pool import AddOutcome, Candidate, Pool
from t3ar_services.retriever.settings import RetrieverSettings
from t3ar_services.retriever.startup import load_index, open_pool, save_index, sweep_orphans
from t3ar_services.retriever.store import NewItem, Store, id_checksum

D = 8


def _vec(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(D).astype(np.float32)
    return v / np.linalg.norm(v)


def _item(seed: int, source: str = "s") -> NewItem:
    return NewItem(hashlib.sha256(str(seed).encode()).hexdigest(), source, {"n": seed}, f"{seed}.png", "image/png",
                   10, 4, 4, _vec(seed))


def test_store_insert_delete_state_and_seq_never_reused(tmp_path: Path) -> None:
    store = Store(tmp_path / "p.sqlite3")
    seqs = store.insert([_item(i, "a" if i < 3 else "b") for i in range(5)])
    assert seqs == [1, 2, 3, 4, 5]
    st = store.state()
    assert st.count == 5 and st.checksum == id_checksum(np.array(seqs)) and st.generation == 1
    assert store.sources() == {"a": 3, "b": 2} and store.seqs_for_source("b").tolist() == [4, 5]
    row = store.get(2)
    assert row is not None and row.metadata == {"n": 1} and row.source == "a"
    stored = store.vector(2)
    assert stored is not None and np.array_equal(stored, _vec(1))
    assert [r.seq for r in store.delete([5, 99])] == [5]
    assert store.insert([_item(9)]) == [6]  # AUTOINCREMENT: 5 is never handed out again
    sha9 = _item(9).sha256
    assert sha9 is not None and store.find_sha([sha9, "x"]) == {sha9: 6}
    assert [r.seq for r in store.page(after=2, limit=2, source=None)] == [3, 4]
    batches = list(store.iter_vectors(D, batch=2))
    assert [b[0].tolist() for b in batches] == [[1, 2], [3, 4], [6]]
    assert store.state().generation == 3
    store.close()


def test_deleted_vector_bytes_leave_the_database_files(tmp_path: Path) -> None:
    store = Store(tmp_path / "p.sqlite3")
    secret = np.full(D, 0.123456, dtype=np.float32)
    store.insert([NewItem(None, "s", {}, None, None, 0, None, None, secret), _item(1)])
    needle = secret.tobytes()
    assert store.delete([1]) and store.checkpoint()
    on_disk = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert needle not in on_disk
    store.close()


def _pool(tmp_path: Path, **kw: object) -> Pool:
    settings = RetrieverSettings(data_dir=tmp_path / "pool", auth_disabled=True, embedder="none", vector_dim=D,
                                 vector_identity="unit-test", **kw)  # type: ignore[arg-type]
    pool, needs_reembed = open_pool(settings, None, None)
    assert not needs_reembed
    sweep_orphans(pool)
    load_index(pool)
    return pool


def _cand(name: str, seed: int, vec: np.ndarray | None = None) -> Candidate:
    data = f"image-{seed}".encode()
    return Candidate(name, data, hashlib.sha256(data).hexdigest(), "image/png", 4, 4,
                     _vec(seed) if vec is None else vec)


def test_add_exact_and_near_duplicates_skip_policy(tmp_path: Path) -> None:
    pool = _pool(tmp_path, duplicate_threshold=0.99)
    near = _vec(1) + 0.001 * _vec(2)
    near /= np.linalg.norm(near)
    out = pool.add([_cand("a", 1), _cand("a-again", 1), _cand("a-near", 99, near), _cand("b", 2),
                    AddOutcome.rejected("bad", "bad_image", "nope")], source="", metadata={}, policy="skip")
    assert [o.status for o in out] == ["added", "exists", "duplicate", "added", "rejected"]
    a_id = out[0].id
    assert out[1].id == a_id and out[2].duplicate_of == a_id and out[2].id is None
    assert out[2].score is not None and out[2].score > 0.99
    again = pool.add([_cand("a-near", 99, near)], source="", metadata={}, policy="keep")
    assert again[0].status == "added" and again[0].duplicate_of == a_id  # against the pool this time
    assert pool.store.count() == 3 and pool.index is not None and pool.index.count == 3
    assert all(pool.blobs.exists(c.sha256) for c in (_cand("a", 1), _cand("b", 2)))


def test_delete_is_all_or_nothing_and_withdraws_everywhere(tmp_path: Path) -> None:
    pool = _pool(tmp_path)
    ids = [str(o.id) for o in pool.add([_cand(f"c{i}", i) for i in range(4)], source="", metadata={}, policy="skip")]
    with pytest.raises(NotFoundError, match="nothing was deleted"):
        pool.delete([ids[0], "nope"], missing_ok=False)
    assert pool.store.count() == 4
    deleted, missing = pool.delete([ids[0], "nope", f"{pool.info.tag}-77"], missing_ok=True)
    assert deleted == [ids[0]] and missing == ["nope", f"{pool.info.tag}-77"]
    assert not pool.blobs.exists(_cand("c0", 0).sha256)
    hits = pool.search(np.stack([_vec(i) for i in range(4)]), k=4)
    assert all(ids[0] not in row_ids and len(row_ids) == 3 for row_ids, _ in hits)
    assert hits[1][0][0] == ids[1] and hits[1][1][0] == pytest.approx(1.0, abs=1e-5)


def test_restart_uses_saved_index_only_when_it_matches(tmp_path: Path) -> None:
    pool = _pool(tmp_path)
    ids = [str(o.id) for o in pool.add([_cand(f"c{i}", i) for i in range(5)], source="", metadata={}, policy="skip")]
    save_index(pool)
    pool.blobs.close()
    pool.store.close()
    assert pool.index_path.exists()
    pool = _pool(tmp_path)
    assert pool.info.repairs == [] and pool.index is not None and pool.index.count == 5
    assert not pool.index_path.exists()  # a start-up cache: removed once loaded
    pool.delete([ids[0]], missing_ok=False)
    (pool.info.data_dir / "blobs" / "a" / ("ab" + "1" * 62)).write_bytes(b"orphan")
    pool.blobs.close()
    pool.store.close()
    pool = _pool(tmp_path)  # no saved index (as after a crash): rebuilt, orphan swept
    assert any("rebuilt the index from 4" in r for r in pool.info.repairs)
    assert any("1 orphan" in r for r in pool.info.repairs)
    assert pool.index is not None and set(pool.index.live_ids().tolist()) == {2, 3, 4, 5}


def test_pool_identity_mismatch_is_refused(tmp_path: Path) -> None:
    _pool(tmp_path).store.close()
    settings = RetrieverSettings(data_dir=tmp_path / "pool", auth_disabled=True, embedder="none", vector_dim=D + 1,
                                 vector_identity="unit-test")
    with pytest.raises(PoolIdentityError, match="8-d vectors"):
        open_pool(settings, None, None)
    settings = RetrieverSettings(data_dir=tmp_path / "pool", auth_disabled=True)
    with pytest.raises(PoolIdentityError, match="vectors pool"):
        open_pool(settings, "timm:x:96px", 1280)


def test_ids_parse_strictly(tmp_path: Path) -> None:
    pool = _pool(tmp_path)
    tag = pool.info.tag
    assert pool.parse_id(f"{tag}-12") == 12
    for bad in ("12", f"{tag}-012", f"{tag}-0", f"{tag}--3", f"{tag}-1x", "zzzzzz-1", f"{tag}-"):
        assert pool.parse_id(bad) is None, bad

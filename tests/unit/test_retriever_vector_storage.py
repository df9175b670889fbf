"""float16 vector storage: the vectors in ``vectors.f16`` beside a database that keeps only metadata; existing
(``sqlite``) pools keep working and move only when asked; compaction's near-duplicate scan and re-embedding read
and write the file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest
from retriever_kit import pool_settings, unit_vectors

from t3ar_services.retriever.curation import NearDuplicatesRequest, near_duplicates
from t3ar_services.retriever.errors import PoolConflictError
from t3ar_services.retriever.index import marker_path
from t3ar_services.retriever.settings import RetrieverSettings
from t3ar_services.retriever.startup import load_index, open_pool, save_index
from t3ar_services.retriever.store import VECTOR_FILE, Store

D = 32


def _unit(n: int, seed: int) -> np.ndarray:
    return unit_vectors(n, D, seed)


def _settings(tmp_path: Path, **kw: object) -> RetrieverSettings:
    return pool_settings(tmp_path, D, **kw)


def _column_bytes(data: Path) -> int:
    with sqlite3.connect(data / "pool.sqlite3") as db:
        return int(db.execute("SELECT coalesce(sum(length(vector)), 0) FROM items").fetchone()[0])


def test_a_new_ivfpq_pool_keeps_its_vectors_in_float16_and_sqlite_only_metadata(tmp_path: Path) -> None:
    settings = _settings(tmp_path, index_type="ivfpq", pq_m=8, ivf_nlist=8, ivf_train_min=100_000)
    pool, _ = open_pool(settings, None, None)
    load_index(pool)
    vecs = _unit(300, 0)
    ids = pool.add_vectors(vecs, source="s", metadata={})
    assert pool.stats()["vector_storage"] == "float16" and _column_bytes(settings.data_dir) == 0
    seq = pool.require_seq(ids[5])
    got = pool.store.vector(seq)
    assert got is not None and np.abs(got - vecs[5]).max() < 1e-3
    pool.delete(ids[:2], missing_ok=False)
    assert pool.store.vector(pool.require_seq(ids[0])) is None
    rows = (settings.data_dir / VECTOR_FILE).read_bytes()
    assert vecs[0].astype(np.float16).tobytes() not in rows and vecs[5].astype(np.float16).tobytes() in rows
    pool.store.close()
    pool, _ = open_pool(settings, None, None)  # a restart: the file is the truth, the index rebuilt from it
    load_index(pool)
    assert [r[0][0] for r in pool.search(vecs[2:12], 1)] == ids[2:12]
    assert sum(len(s) for s, _ in pool.store.iter_vectors(D)) == pool.store.count() == 298
    pool.store.close()


def test_a_sqlite_pool_opens_as_it_is_and_moves_to_float16_only_when_asked(tmp_path: Path) -> None:
    pool, _ = open_pool(_settings(tmp_path), None, None)  # the default: float32 in SQLite, as every older pool
    load_index(pool)
    vecs = _unit(500, 1)
    ids = pool.add_vectors(vecs, source="s", metadata={})
    pool.delete(ids[:1], missing_ok=False)
    pool.store.close()
    data = tmp_path / "pool"
    assert _column_bytes(data) == 499 * D * 4
    size_before = (data / "pool.sqlite3").stat().st_size
    pool, _ = open_pool(_settings(tmp_path, index_type="ivfpq", pq_m=8), None, None)  # auto: it stays as it is
    assert pool.store.vector_storage == "sqlite" and pool.info.repairs == []
    pool.store.close()
    pool, _ = open_pool(_settings(tmp_path, vector_storage="float16"), None, None)  # asked: migrated at start-up
    assert pool.store.vector_storage == "float16" and "moved 499 vectors" in pool.info.repairs[0]
    load_index(pool)
    # vacuumed: most of the vectors' 499 x D x 4 bytes left the file (the rest is page overhead and other tables')
    assert _column_bytes(data) == 0 and (data / "pool.sqlite3").stat().st_size <= size_before - 499 * D * 4 * 3 // 4
    assert [r[0][0] for r in pool.search(vecs[1:21], 1)] == ids[1:21]
    got = dict(zip(*next(iter(pool.store.iter_vectors(D, batch=1000))), strict=True))
    assert pool.require_seq(ids[0]) not in got
    assert max(np.abs(got[pool.require_seq(i)] - v).max() for i, v in zip(ids[1:], vecs[1:], strict=True)) < 1e-3
    pool.store.close()
    with pytest.raises(PoolConflictError, match="cannot move them"):
        open_pool(_settings(tmp_path, vector_storage="sqlite"), None, None)


def test_compaction_scan_and_reembedding_use_the_float16_file(tmp_path: Path) -> None:
    pool, _ = open_pool(_settings(tmp_path, vector_storage="float16"), None, None)
    load_index(pool)
    vecs = _unit(50, 2)
    dup = vecs[3] + 0.001 * _unit(1, 3)[0]
    ids = pool.add_vectors(np.concatenate([vecs, (dup / np.linalg.norm(dup))[None]]), source="s", metadata={})
    res = near_duplicates(pool.store.path, D, pool.format_id, NearDuplicatesRequest(threshold=0.99, sources=["s"]))
    assert [(r.id, r.duplicate_of) for r in res.remove] == [(ids[50], ids[3])]
    new = _unit(51, 4)
    seqs = [pool.require_seq(i) for i in ids]
    pool.store.reembed_stage(seqs, new)
    pool.store.reembed_finish({"identity": "t2"})
    pool.store.reembed_finish({"identity": "t2"})  # repeated (a crash after the file was written): the same
    got = pool.store.vector(seqs[7])
    assert got is not None and np.abs(got - new[7]).max() < 1e-3 and pool.store.meta()["identity"] == "t2"
    pool.store.close()


def test_use_float16_refuses_a_pool_with_items(tmp_path: Path) -> None:
    store = Store(tmp_path / "pool.sqlite3")
    store.set_meta({"dim": str(D)})
    store.insert_vectors(_unit(2, 5), "s", {})
    with pytest.raises(RuntimeError, match="empty pool"):
        store.use_float16(D)
    store.close()


def test_a_migration_that_fails_before_its_commit_leaves_the_sqlite_pool_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pool, _ = open_pool(_settings(tmp_path), None, None)
    load_index(pool)
    vecs = _unit(100, 6)
    pool.add_vectors(vecs, source="s", metadata={})
    pool.store.close()

    def crash(self: object) -> None:
        raise OSError("disk full")

    from t3ar_services.retriever.vecfile import VectorFile

    monkeypatch.setattr(VectorFile, "flush", crash)  # the file written, its fsync fails: no commit follows
    with pytest.raises(OSError, match="disk full"):
        open_pool(_settings(tmp_path, vector_storage="float16"), None, None)
    monkeypatch.undo()
    pool, _ = open_pool(_settings(tmp_path), None, None)
    assert pool.store.vector_storage == "sqlite" and _column_bytes(tmp_path / "pool") == 100 * D * 4
    got = pool.store.vector(1)
    assert got is not None and np.array_equal(got, vecs[0])
    pool.store.close()
    pool, _ = open_pool(_settings(tmp_path, vector_storage="float16"), None, None)  # and a retry completes it
    assert pool.store.vector_storage == "float16" and "moved 100 vectors" in pool.info.repairs[0]
    pool.store.close()


def _rows(data: Path, n: int) -> np.ndarray:
    """The first ``n`` rows of the float16 file as raw bytes, one row per line (seq 0 is never used)."""
    raw = np.frombuffer((data / VECTOR_FILE).read_bytes()[:n * D * 2], dtype=np.uint8)
    return raw.reshape(n, D * 2).copy()


def test_a_crash_between_a_deletes_commit_and_its_zeroing_is_zeroed_when_the_store_opens(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from t3ar_services.retriever.vecfile import VectorFile

    settings = _settings(tmp_path, vector_storage="float16")
    pool, _ = open_pool(settings, None, None)
    load_index(pool)
    ids = pool.add_vectors(_unit(8, 7), source="s", metadata={})
    seqs = [pool.require_seq(i) for i in ids]
    before = _rows(settings.data_dir, 10)

    def killed(self: object, seqs: object) -> None:  # the process dies after the commit, before any row is zeroed
        raise SystemExit("kill -9")

    monkeypatch.setattr(VectorFile, "zero", killed)
    with pytest.raises(SystemExit):
        pool.delete(ids[2:4], missing_ok=False)
    monkeypatch.undo()
    assert pool.store.count() == 6  # the deletion is committed ...
    assert _rows(settings.data_dir, 10)[seqs[2]].any()  # ... and its rows are still on disk
    pool.store.close()
    with caplog.at_level("WARNING"):
        pool, _ = open_pool(settings, None, None)  # the next start zeroes them before anything is served
    after = _rows(settings.data_dir, 10)
    assert not after[seqs[2]].any() and not after[seqs[3]].any()
    survivors = [s for s in seqs if s not in seqs[2:4]]
    assert np.array_equal(after[survivors], before[survivors]) and after[survivors].any(axis=1).all()
    assert any("zeroed the float16 rows of 2 deleted item(s)" in r for r in pool.info.repairs)
    assert "zeroed the float16 rows of 2 deleted item(s)" in caplog.text
    pool.store.close()
    caplog.clear()
    pool, _ = open_pool(settings, None, None)  # done once: nothing left to zero at the start after
    assert pool.info.repairs == [] and "zeroed" not in caplog.text
    load_index(pool)
    assert sorted(pool.search(_unit(8, 7), 8)[0][0]) == sorted(ids[:2] + ids[4:])
    pool.store.close()


def test_a_failed_zeroing_is_retried_by_the_next_delete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from t3ar_services.retriever.vecfile import VectorFile

    store = Store(tmp_path / "pool.sqlite3")
    store.set_meta({"dim": str(D)})
    store.use_float16(D)
    seqs = store.insert_vectors(_unit(4, 8), "s", {})
    def failing(self: object, seqs: object) -> None:
        raise OSError("EIO")

    monkeypatch.setattr(VectorFile, "zero", failing)
    with pytest.raises(OSError, match="EIO"):  # committed, the row not zeroed: the delete answers an error
        store.delete(seqs[:1])
    monkeypatch.undo()
    store.delete(seqs[1:2])  # the next delete zeroes what is still recorded too
    rows = _rows(tmp_path, 5)
    assert not rows[seqs[0]].any() and not rows[seqs[1]].any() and rows[seqs[2]].any()
    store.close()
    assert Store(tmp_path / "pool.sqlite3").zeroed_at_open == 0  # nothing was left recorded


def test_reembedding_never_writes_back_the_row_of_an_item_deleted_meanwhile(tmp_path: Path) -> None:
    store = Store(tmp_path / "pool.sqlite3")
    store.set_meta({"dim": str(D)})
    store.use_float16(D)
    seqs = store.insert_vectors(_unit(3, 9), "s", {})
    store.reembed_stage(seqs, _unit(3, 10))  # a re-embedding interrupted here; the pool served deletes meanwhile
    store.delete(seqs[1:2])
    with sqlite3.connect(tmp_path / "pool.sqlite3") as db:  # its staged vector went with its row
        assert db.execute("SELECT seq FROM reembed").fetchall() == [(seqs[0],), (seqs[2],)]
    store.reembed_stage(seqs[1:2], _unit(1, 11))  # as a data dir staged before deletes took it along holds it
    store.reembed_finish({"identity": "t2"})
    rows = _rows(tmp_path, 4)
    assert not rows[seqs[1]].any() and rows[seqs[0]].any() and rows[seqs[2]].any()
    got = store.vector(seqs[2])
    assert got is not None and np.abs(got - _unit(3, 10)[2]).max() < 1e-3
    store.close()


def test_copies_of_the_vectors_no_delete_would_reach_are_removed_at_start_up(tmp_path: Path) -> None:
    data = tmp_path / "pool"
    pool, _ = open_pool(_settings(tmp_path, index_type="ivfpq", pq_m=8, vector_storage="sqlite"), None, None)
    load_index(pool)  # sqlite storage + ivfpq: the index's own derived copy in index/vectors.f16
    pool.add_vectors(_unit(20, 11), source="s", metadata={})
    save_index(pool)
    pool.store.close()
    assert (data / "index" / VECTOR_FILE).stat().st_size and pool.index_path.exists()
    pool, _ = open_pool(_settings(tmp_path, index_type="flat"), None, None)  # a flat index never updates it
    assert not (data / "index" / VECTOR_FILE).exists() and pool.index_path.exists()
    pool.store.close()
    pool, _ = open_pool(_settings(tmp_path, backend="milvus"), None, None)  # nor does the Milvus backend
    assert not pool.index_path.exists() and not marker_path(pool.index_path).exists()
    pool.store.close()
    (data / VECTOR_FILE).write_bytes(b"\x01" * 64)  # a float16 migration interrupted before its commit
    pool, _ = open_pool(_settings(tmp_path), None, None)  # a sqlite pool: nothing writes or zeroes that file
    assert pool.store.vector_storage == "sqlite" and not (data / VECTOR_FILE).exists()
    assert any("interrupted before its commit" in r for r in pool.info.repairs)
    pool.store.close()

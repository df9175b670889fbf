"""The milvus pool backend across restarts and crashes, and `t3ar pool migrate` (issue 12), each on milvus-lite and
on a real Milvus server (issue 29: the session's ``milvus_server``, tests marked ``milvus_server``).

The add / search / delete / filter / duplicate checks run on both backends in test_retriever_api.py; here:
what only a persistent external index can get wrong (a collection that disagrees with the database after a
crash, a deleted id coming back after a restart) and moving a pool between backends without re-embedding.
"""

from __future__ import annotations

import contextlib
import secrets
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from click.testing import CliRunner

from t3ar.clients.retriever_errors import RetrieverNotFoundError
from t3ar_services.retriever.backend import release_local

if TYPE_CHECKING:
    from conftest import RetrieverProcess

pytest.importorskip("pymilvus", reason="the milvus extra (pymilvus + milvus-lite) is not installed")
Factory = Callable[..., "RetrieverProcess"]
DIM = 24
VEC_ENV = {"T3AR_RETRIEVER_EMBEDDER": "none", "T3AR_RETRIEVER_VECTOR_DIM": str(DIM),
           "T3AR_RETRIEVER_VECTOR_IDENTITY": f"synthetic-{DIM}"}
MILVUS = {**VEC_ENV, "T3AR_RETRIEVER_BACKEND": "milvus"}


@dataclass
class MilvusAt:
    """Where a pool's collection lives: milvus-lite in DATA_DIR/milvus.db (``server`` None) or a Milvus server."""

    server: str | None

    def uri(self, data: Path) -> str:
        return self.server or str(data / "milvus.db")

    def env(self) -> dict[str, str]:
        return {**MILVUS, "T3AR_RETRIEVER_MILVUS_URI": self.server} if self.server else MILVUS

    def release(self, data: Path) -> None:
        """milvus-lite allows one process per file: let go of it before the retriever opens it."""
        if not self.server:
            release_local(str(data / "milvus.db"))


@pytest.fixture(params=["milvus-lite", pytest.param("milvus-server", marks=pytest.mark.milvus_server)])
def milvus_at(request: pytest.FixtureRequest) -> MilvusAt:
    if request.param == "milvus-lite":
        pytest.importorskip("milvus_lite", reason="the milvus extra (pymilvus + milvus-lite) is not installed")
        return MilvusAt(None)
    return MilvusAt(request.getfixturevalue("milvus_server").uri)


def _vectors(n: int, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _found(c: object, queries: np.ndarray, k: int = 200) -> set[str]:
    return {i for row in c.search(queries, k=k).ids for i in row}  # type: ignore[attr-defined]


def test_milvus_deletes_stay_deleted_across_restarts_and_a_disagreeing_collection_is_repaired(
        tmp_path: Path, retriever_factory: Factory, milvus_at: MilvusAt) -> None:
    from pymilvus import MilvusClient

    data, vecs = tmp_path / "pool", _vectors(60)
    rp = retriever_factory(data, milvus_at.env())
    with rp.client() as c:
        assert c.health().backend == "milvus" and c.stats().index.type == "milvus"
        ids = c.add_vectors(vecs[:50], identity=f"synthetic-{DIM}", source="a")
        ids += c.add_vectors(vecs[50:], identity=f"synthetic-{DIM}", source="b")
        c.delete(ids[0])
        c.delete_many(ids[1:3])
        assert not _found(c, vecs[:3]) & set(ids[:3])  # right after the 2xx (Strong consistency)
        assert set(c.search(vecs[50:51], k=5, source="b").ids[0]) <= set(ids[50:])
        tag = c.stats().pool_tag
    assert rp.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
    rp = retriever_factory(data, milvus_at.env())
    with rp.client() as c:
        st = c.stats()
        assert st.repairs == [] and st.count == 57 and st.index.vectors == 57
        assert not _found(c, vecs[:3]) & set(ids[:3])
        with pytest.raises(RetrieverNotFoundError):
            c.get_item(ids[0])
        c.delete(ids[3])
    rp.stop(signal.SIGKILL)
    # The worst case after a crash: a collection that still holds deleted vectors and lost a live one.
    client = MilvusClient(milvus_at.uri(data))
    coll = f"t3ar_pool_{tag}"
    client.insert(coll, [{"seq": int(i.split("-")[1]), "vector": vecs[j].tolist()} for j, i in enumerate(ids[:4])])
    client.delete(coll, ids=[int(ids[10].split("-")[1])])
    client.close()
    milvus_at.release(data)
    rp = retriever_factory(data, milvus_at.env())
    with rp.client() as c:
        st = c.stats()
        assert any("inserted 1, removed 4" in r for r in st.repairs), st.repairs
        found = _found(c, vecs[:11])
        assert not found & set(ids[:4]) and ids[10] in found and st.count == st.index.vectors == 56


def test_pool_migrate_moves_a_pool_between_backends_without_reembedding(
        tmp_path: Path, retriever_factory: Factory, milvus_at: MilvusAt) -> None:
    from pymilvus import MilvusClient

    from t3ar_services.cli.pool_migrate import migrate

    data, vecs = tmp_path / "pool", _vectors(300, seed=1)
    rp = retriever_factory(data, VEC_ENV)
    with rp.client() as c:
        ids = c.add_vectors(vecs, identity=f"synthetic-{DIM}", source="s")
        labelled = c.add_vectors(_vectors(4, seed=9), identity=f"synthetic-{DIM}", source="s", label="dog")
        c.delete_many(ids[:5])
        before = c.search(vecs[:20], k=10)
        tag = c.stats().pool_tag
    assert rp.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
    # An interrupted earlier run: part of the pool is already in the collection, plus one deleted vector.
    runner = CliRunner()
    uri = ["--milvus-uri", milvus_at.uri(data)]
    out = runner.invoke(migrate, ["--data-dir", str(data), "--to", "milvus", "--check", "0", *uri])
    assert out.exit_code == 0, out.output
    client = MilvusClient(milvus_at.uri(data))
    coll = f"t3ar_pool_{tag}"
    client.delete(coll, ids=[int(i.split("-")[1]) for i in ids[100:]])
    client.insert(coll, [{"seq": int(ids[0].split("-")[1]), "vector": vecs[0].tolist()}])
    client.close()
    milvus_at.release(data)
    out = runner.invoke(migrate, ["--data-dir", str(data), "--to", "milvus", "--drop-old", *uri])
    assert out.exit_code == 0, out.output
    assert "200 vectors inserted, 1 removed" in out.output, out.output
    assert not list((data / "index").glob("faiss.index*"))
    rp = retriever_factory(data, milvus_at.env())
    with rp.client() as c:
        st = c.stats()
        assert st.repairs == [] and st.count == 299 and st.sources == {"s": 299}
        assert st.labels == {"dog": 4} and c.get_item(labelled[0]).label == "dog"  # labels kept (issue 33)
        assert c.search(_vectors(4, seed=9)[:1], k=1).labels == [["dog"]]
        after = c.search(vecs[:20], k=10)
        assert after.ids == before.ids and np.allclose(after.scores, before.scores, atol=1e-5)
        c.delete(ids[5])
    assert rp.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
    out = runner.invoke(migrate, ["--data-dir", str(data), "--to", "faiss", "--drop-old", *uri])
    assert out.exit_code == 0, out.output
    rp = retriever_factory(data, VEC_ENV)
    with rp.client() as c:
        st = c.stats()
        assert st.repairs == [] and st.count == 298 and st.index.type == "flat"
        assert c.list_items(label="dog").total == 4
        assert c.search(vecs[6:7], k=1).ids == [[ids[6]]] and ids[5] not in _found(c, vecs[:20])
    bad = runner.invoke(migrate, ["--data-dir", str(data), "--to", "milvus", "--milvus-uri", "http://127.0.0.1:9"])
    assert bad.exit_code == 1 and "cannot use the Milvus server at 'http://127.0.0.1:9'" in bad.output


def test_unreachable_milvus_refuses_to_start_and_says_where(tmp_path: Path, retriever_factory: Factory) -> None:
    rp = retriever_factory(tmp_path / "pool", {**MILVUS, "T3AR_RETRIEVER_MILVUS_URI": "http://127.0.0.1:9",
                                               "T3AR_RETRIEVER_MILVUS_TIMEOUT": "2"}, wait=None)
    assert rp.proc.wait(timeout=120) != 0
    assert "cannot use the Milvus server at 'http://127.0.0.1:9'" in rp.log()


@dataclass
class InProcess:
    """A Pool in this process on a Milvus collection of its own (the server is shared by the session), with
    the candidates of ``n`` distinct images."""

    pool: Any
    index: Any
    store: Any
    blobs: Any
    vecs: np.ndarray
    cands: list[Any]


@contextlib.contextmanager
def _in_process_pool(tmp_path: Path, milvus_at: MilvusAt, n: int, seed: int) -> Iterator[InProcess]:
    import hashlib

    from t3ar_services.retriever.backend import MilvusIndex, connect
    from t3ar_services.retriever.blobs import BlobStore
    from t3ar_services.retriever.index import IndexConfig
    from t3ar_services.retriever.pool import Candidate, Pool, PoolInfo
    from t3ar_services.retriever.store import Store

    uri = milvus_at.uri(tmp_path)
    store, blobs = Store(tmp_path / "pool.sqlite3"), BlobStore(tmp_path / "blobs")
    index = MilvusIndex(connect(uri, None), f"t3ar_pool_{secrets.token_hex(4)}", DIM,
                        None if milvus_at.server else uri, present=store.present)
    pool = Pool(PoolInfo(tmp_path, "synthetic", DIM, "images", "abc123", IndexConfig(), 0.98, "milvus"), store, blobs)
    pool.index = index
    vecs = _vectors(n, seed=seed)
    data = [b"image %d" % i for i in range(n)]
    cands = [Candidate(f"{i}.png", d, hashlib.sha256(d).hexdigest(), "image/png", 1, 1, vecs[i])
             for i, d in enumerate(data)]
    try:
        yield InProcess(pool, index, store, blobs, vecs, cands)
    finally:
        index.close()
        blobs.close()
        store.close()


def _down(*args: object, **kwargs: object) -> None:
    raise ConnectionError("milvus went away")


def test_a_failed_milvus_write_leaves_nothing_half_written(tmp_path: Path, milvus_at: MilvusAt) -> None:
    """In-process Pool whose Milvus client fails: an add is withdrawn (no row, no blob), a delete is not
    acknowledged and loses nothing; once Milvus works again both go through."""
    from t3ar_services.retriever.errors import NotReadyError

    with _in_process_pool(tmp_path, milvus_at, 3, seed=2) as t:
        pool, index, store, blobs, vecs, cands = t.pool, t.index, t.store, t.blobs, t.vecs, t.cands
        first = pool.add(cands[:1], source="", metadata={}, policy="keep")[0]
        assert first.status == "added" and first.id is not None
        insert, delete = index.client.insert, index.client.delete
        index.client.insert = _down
        with pytest.raises(NotReadyError, match="milvus went away"):
            pool.add(cands[1:], source="", metadata={}, policy="keep")
        assert store.count() == 1 and index.count == 1
        assert not any(blobs.exists(c.sha256) for c in cands[1:])
        index.client.insert, index.client.delete = insert, _down
        with pytest.raises(NotReadyError):
            pool.delete([first.id], missing_ok=False)
        assert store.count() == 1 and blobs.exists(cands[0].sha256)  # not acknowledged, nothing lost
        assert pool.search(vecs[:1], 3)[0][0] == [first.id]
        index.client.delete = delete
        assert [o.status for o in pool.add(cands[1:], source="", metadata={}, policy="keep")] == ["added", "added"]
        assert pool.delete([first.id], missing_ok=False) == ([first.id], [])
        assert first.id not in pool.search(vecs[:1], 3)[0][0] and not blobs.exists(cands[0].sha256)
        assert store.count() == index.count == 2


def test_an_add_whose_answer_was_lost_and_whose_withdrawal_failed_is_never_searched(
        tmp_path: Path, milvus_at: MilvusAt) -> None:
    """Milvus took an insert but the answer was lost, and deleting it again failed too: the add is refused (503),
    its vectors are excluded from every search at once, and the next write deletes them from the collection."""
    from t3ar_services.retriever.errors import NotReadyError

    with _in_process_pool(tmp_path, milvus_at, 4, seed=5) as t:
        pool, index, store, vecs, cands = t.pool, t.index, t.store, t.vecs, t.cands
        insert, delete = index.client.insert, index.client.delete

        def lost_answer(*args: object, **kwargs: object) -> None:
            insert(*args, **kwargs)  # it reached Milvus...
            raise ConnectionError("connection reset")  # ...but the answer did not come back

        kept = pool.add(cands[:1], source="", metadata={}, policy="keep")[0]
        index.client.insert, index.client.delete = lost_answer, _down
        with pytest.raises(NotReadyError, match="connection reset"):
            pool.add(cands[1:3], source="", metadata={}, policy="keep")
        assert store.count() == 1 and index.ghosts == 2
        hits = {i for row, _ in pool.search(vecs, 4) for i in row}
        assert hits == {kept.id}  # the ghosts are in the collection, never in an answer
        index.client.insert, index.client.delete = insert, delete
        added = pool.add(cands[3:], source="", metadata={}, policy="keep")[0]  # the next write deletes them
        assert index.ghosts == 0 and store.count() == index.count == 2
        assert sorted(int(s) for s in index.live_ids()) == sorted(int(i.split("-")[1]) for i in (kept.id, added.id))
        assert {i for row, _ in pool.search(vecs, 4) for i in row} == {kept.id, added.id}


def test_a_delete_whose_answer_was_lost_keeps_its_item_searchable(tmp_path: Path, milvus_at: MilvusAt) -> None:
    """Milvus took a delete but the answer was lost: the delete is not acknowledged (503) and the row stays, so
    the next call puts its vector back (the item is found again); a retried delete then removes it for good."""
    from t3ar_services.retriever.errors import NotReadyError

    with _in_process_pool(tmp_path, milvus_at, 2, seed=7) as t:
        pool, index, store, vecs, cands = t.pool, t.index, t.store, t.vecs, t.cands
        a, b = (o.id for o in pool.add(cands, source="", metadata={}, policy="keep"))
        delete = index.client.delete

        def lost_answer(*args: object, **kwargs: object) -> None:
            delete(*args, **kwargs)  # it reached Milvus...
            raise ConnectionError("connection reset")  # ...but the answer did not come back

        index.client.delete = lost_answer
        with pytest.raises(NotReadyError, match="connection reset"):
            pool.delete([a], missing_ok=False)
        index.client.delete = delete
        assert store.count() == 2 and index.pending  # not acknowledged: the row stays
        assert pool.search(vecs[:1], 1)[0][0] == [a]  # put back before the search
        assert not index.pending and index.count == 2
        assert pool.delete([a], missing_ok=False) == ([a], [])  # the retry
        assert {i for row, _ in pool.search(vecs, 2) for i in row} == {b} and store.count() == index.count == 1


def test_an_id_milvus_still_returns_after_its_row_is_gone_is_filtered_and_k_results_still_come_back(
        tmp_path: Path, milvus_at: MilvusAt) -> None:
    """What a search at Bounded consistency can meet: Milvus still holding a vector whose delete it has not applied
    yet (here: the row deleted and Milvus not told at all, the most stale view there is). The answer never holds it,
    and the search asks Milvus for more so that k results come back."""
    with _in_process_pool(tmp_path, milvus_at, 40, seed=11) as t:
        pool, index, store, vecs, cands = t.pool, t.index, t.store, t.vecs, t.cands
        ids = [o.id for o in pool.add(cands, source="", metadata={}, policy="keep")]
        assert all(ids)
        seqs = [pool.require_seq(i) for i in ids if i]
        store.delete(seqs[:30])  # gone from the pool's record, still in the collection
        assert index.count == 40
        for q in range(30):
            row = pool.search(vecs[q:q + 1], 10)[0][0]
            assert len(row) == 10 and not set(row) & set(ids[:30]), (q, row)
        assert {i for row, _ in pool.search(vecs, 10) for i in row} == set(ids[30:])
        assert index.filtered >= 30


def test_deletes_racing_searches_from_several_clients_never_return_a_deleted_id_after_its_2xx(
        tmp_path: Path, retriever_factory: Factory, milvus_at: MilvusAt) -> None:
    """Two clients deleting and three searching at once over HTTP (the searches ask for the vectors of the ids
    deleted last and next): no id comes back in a search sent after its DELETE answered 2xx."""
    from milvus_race import RaceLog, never_returned, race

    data, vecs = tmp_path / "pool", _vectors(300, seed=13)
    rp = retriever_factory(data, milvus_at.env())
    with rp.client() as c:
        ids = c.add_vectors(vecs, identity=f"synthetic-{DIM}")
    vectors = dict(zip(ids, vecs, strict=True))
    log = RaceLog()
    race(lambda: rp.client(retries=0, timeout=60), ids[:120], vectors, log, max_seconds=120)
    assert not log.errors and not log.unsure and log.searches >= 20, (log.errors[:3], log.unsure, log.searches)
    assert len(log.deleted) == 120 and not log.violations, log.violations[:5]
    with rp.client() as c:
        assert never_returned(c, log, vectors) == []
        assert c.stats().count == 180


def test_a_collection_indexed_otherwise_is_reindexed_at_start_up_and_keeps_its_vectors(
        tmp_path: Path, milvus_at: MilvusAt) -> None:
    """A collection made with the FLAT index (every collection before HNSW became the default) opened with the
    HNSW configuration: re-indexed, its vectors kept and found."""
    from t3ar_services.retriever.backend import MilvusConfig, MilvusIndex, connect

    uri, name, vecs = milvus_at.uri(tmp_path / "pool"), f"t3ar_pool_{secrets.token_hex(4)}", _vectors(50, seed=17)
    local = None if milvus_at.server else uri
    old = MilvusIndex(connect(uri, None), name, DIM, local, config=MilvusConfig(index="FLAT", consistency="Strong"))
    old.add(np.arange(1, 51), vecs)
    old.flush()
    old.close()
    new = MilvusIndex(connect(uri, None), name, DIM, local, config=MilvusConfig())
    try:
        index_name = new.client.list_indexes(name, field_name="vector")[0]
        assert new.client.describe_index(name, index_name)["index_type"] == "HNSW"
        assert new.count == 50
        _, seqs = new.search(vecs[:5], 1)
        assert [int(s[0]) for s in seqs] == [1, 2, 3, 4, 5]
    finally:
        new.client.drop_collection(name)
        new.close()

"""The deletion guarantee on a real Milvus server (issue 29): the retriever over HTTP on 127.0.0.1 with
``T3AR_RETRIEVER_BACKEND=milvus`` pointed at the session's Milvus 2.3.5 standalone process (``milvus_server``).

Delete -> never returned by search or GET: right after the 2xx, after a restart of the retriever, after a
restart of the Milvus server, after kill -9 of either in the middle of an ingest. Acknowledged adds are never
lost, and while the server is down the retriever answers 503 with a message instead of hanging.
"""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from t3ar.clients.retriever import RetrieverClient
from t3ar.clients.retriever_errors import RetrieverError, RetrieverNotFoundError, RetrieverUnavailableError

if TYPE_CHECKING:
    from conftest import RetrieverProcess
    from milvus_server import MilvusServer

pytest.importorskip("pymilvus", reason="the milvus extra (pymilvus) is not installed")
pytestmark = [pytest.mark.milvus_server, pytest.mark.slow]  # about a minute each, like the retriever's kill -9 tests

Factory = Callable[..., "RetrieverProcess"]
DIM = 24
IDENTITY = f"synthetic-{DIM}"
ANSWER_S = 60  # a call while Milvus is down must be answered (503) within this, never hang


def _env(server: MilvusServer) -> dict[str, str]:
    return {"T3AR_RETRIEVER_EMBEDDER": "none", "T3AR_RETRIEVER_VECTOR_DIM": str(DIM),
            "T3AR_RETRIEVER_VECTOR_IDENTITY": IDENTITY, "T3AR_RETRIEVER_BACKEND": "milvus",
            "T3AR_RETRIEVER_MILVUS_URI": server.uri, "T3AR_RETRIEVER_DUPLICATE_POLICY": "keep"}


def _vectors(n: int, seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _check(rp: RetrieverProcess, live: dict[str, np.ndarray], deleted: dict[str, np.ndarray]) -> None:
    """Every live id is found (top-1 for its own vector) and readable; no deleted id is searched or readable;
    and search never returns an id that GET does not know."""
    with rp.client(timeout=ANSWER_S) as c:
        queries = np.stack(list(live.values()) + list(deleted.values()))
        res = c.search(queries, k=min(200, max(1, len(live))))
        found = {i for row in res.ids for i in row}
        assert not found & set(deleted), f"deleted ids returned by search: {sorted(found & set(deleted))[:5]}"
        assert [row[0] for row in res.ids[:len(live)]] == list(live), "a live item is not its own top-1"
        for item_id in deleted:
            with pytest.raises(RetrieverNotFoundError):
                c.get_item(item_id)
        unknown = sorted(found - set(live))
        assert not unknown, f"search returned ids that are not in the pool: {unknown[:5]}"
        st = c.stats()
        assert st.count == st.index.vectors == len(live), st


def _wait_serving(rp: RetrieverProcess, timeout: float = 120) -> None:
    """The retriever answers a search again (after the Milvus server came back)."""
    deadline = time.monotonic() + timeout
    with rp.client(retries=0, timeout=ANSWER_S) as c:
        while True:
            try:
                c.search(_vectors(1, 0), k=1)
                return
            except RetrieverUnavailableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)


def test_deleted_ids_never_come_back_across_restarts_of_the_retriever_and_the_milvus_server(
        tmp_path: Path, retriever_factory: Factory, milvus_server: MilvusServer) -> None:
    data, vecs = tmp_path / "pool", _vectors(80, seed=1)
    rp = retriever_factory(data, _env(milvus_server))
    with rp.client() as c:
        assert c.health().backend == "milvus" and c.stats().index.type == "milvus"
        ids = c.add_vectors(vecs, identity=IDENTITY, source="s")
        c.delete(ids[0])
        c.delete_many(ids[1:10])
    live = dict(zip(ids[10:], vecs[10:], strict=True))
    deleted = dict(zip(ids[:10], vecs[:10], strict=True))
    _check(rp, live, deleted)  # right after the 2xx
    assert rp.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
    rp = retriever_factory(data, _env(milvus_server))
    _check(rp, live, deleted)  # a restart of the retriever
    with rp.client() as c:
        c.delete(ids[10])
    deleted[ids[10]] = live.pop(ids[10])
    milvus_server.restart()  # a restart of the Milvus server under a running retriever
    _wait_serving(rp)
    _check(rp, live, deleted)
    assert rp.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
    rp = retriever_factory(data, _env(milvus_server))
    _check(rp, live, deleted)  # both restarted
    assert rp.stop(signal.SIGTERM) in (0, -signal.SIGTERM)


class _Ingest(threading.Thread):
    """Adds batches of vectors and deletes one acknowledged id every third batch until stopped or a call fails;
    records what was acknowledged (2xx) and how long the failing call took."""

    def __init__(self, rp: RetrieverProcess, seed: int) -> None:
        super().__init__(daemon=True)
        self.rp, self.seed = rp, seed
        self.live: dict[str, np.ndarray] = {}
        self.deleted: dict[str, np.ndarray] = {}
        self.error: RetrieverError | None = None
        self.error_after = 0.0  # seconds the failing call took
        self.unsure: dict[str, np.ndarray] = {}  # an id whose delete failed: it may or may not have happened
        self.halt = threading.Event()

    def run(self) -> None:
        with self.rp.client(retries=0, timeout=ANSWER_S + 60) as c:
            n = 0
            while not self.halt.is_set():
                vecs = _vectors(8, seed=self.seed + n)
                t0 = time.monotonic()
                try:
                    if n % 3 == 2:
                        victim = next(iter(self.live))
                        c.delete(victim)
                        self.deleted[victim] = self.live.pop(victim)
                    else:
                        self.live.update(zip(c.add_vectors(vecs, identity=IDENTITY), vecs, strict=True))
                except RetrieverError as e:
                    self.error, self.error_after = e, time.monotonic() - t0
                    if n % 3 == 2:  # a delete without an answer may or may not have happened: neither set holds it
                        self.unsure[victim] = self.live.pop(victim)
                    return
                n += 1


def _ingesting(rp: RetrieverProcess, seed: int, acked: int = 120) -> _Ingest:
    """An :class:`_Ingest` into ``rp`` started and run until at least ``acked`` adds and a delete were answered."""
    ingest = _Ingest(rp, seed)
    ingest.start()
    deadline = time.monotonic() + 120
    while len(ingest.live) < acked and ingest.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(ingest.live) >= acked and ingest.deleted, (len(ingest.live), ingest.error)
    return ingest


def test_kill9_of_the_retriever_mid_ingest_loses_no_acknowledged_add_and_returns_no_deleted_id(
        tmp_path: Path, retriever_factory: Factory, milvus_server: MilvusServer) -> None:
    data = tmp_path / "pool"
    rp = retriever_factory(data, _env(milvus_server))
    ingest = _ingesting(rp, seed=100)
    rp.stop(signal.SIGKILL)  # mid-ingest: the thread is always sending
    ingest.join(timeout=ANSWER_S)
    assert ingest.error is not None, "the ingest should have been cut off by the kill"
    rp = retriever_factory(data, _env(milvus_server))
    with rp.client() as c:
        present = {it.id for it in c.iter_items()}
    assert set(ingest.live) <= present and not present & set(ingest.deleted)
    # An add cut off by the kill may have been committed without its answer (and a delete cut off may not have
    # happened): then it is in the pool, and searchable.
    with sqlite3.connect(data / "pool.sqlite3") as db:
        extra = {i: np.frombuffer(db.execute("SELECT vector FROM items WHERE seq = ?", (int(i.split("-")[1]),))
                                  .fetchone()[0], dtype="<f4") for i in present - set(ingest.live)}
    _check(rp, {**ingest.live, **extra}, ingest.deleted)


def test_kill9_of_the_milvus_server_mid_ingest_answers_503_and_loses_nothing_once_it_is_back(
        tmp_path: Path, retriever_factory: Factory, milvus_server: MilvusServer) -> None:
    data = tmp_path / "pool"
    rp = retriever_factory(data, _env(milvus_server))
    ingest = _ingesting(rp, seed=200)
    try:
        milvus_server.kill()  # mid-ingest
        ingest.join(timeout=2 * ANSWER_S)
        assert not ingest.is_alive(), "the retriever did not answer the ingest while Milvus was down"
        err = ingest.error
        assert isinstance(err, RetrieverUnavailableError) and err.status == 503 and err.code == "not_ready", err
        assert "Milvus" in str(err) and ingest.error_after < ANSWER_S, (str(err), ingest.error_after)
        with rp.client(retries=0, timeout=ANSWER_S) as c:  # a search and a delete: 503 too, nothing deleted
            t0 = time.monotonic()
            with pytest.raises(RetrieverUnavailableError, match="Milvus"):
                c.search(_vectors(1, 0), k=5)
            with pytest.raises(RetrieverUnavailableError, match="Milvus"):
                c.delete(next(iter(ingest.live)))
            assert time.monotonic() - t0 < 2 * ANSWER_S
    finally:
        milvus_server.start()
    _wait_serving(rp)
    # The add that failed (503) was withdrawn; a delete that failed (503) kept its item: if the kill hit a delete,
    # its victim is in the pool (and must then be found like any live item), never half there.
    with rp.client() as c:
        present = {it.id for it in c.iter_items()}
    assert set(ingest.live) <= present and not present & set(ingest.deleted)
    assert present - set(ingest.live) <= set(ingest.unsure), sorted(present - set(ingest.live))[:5]
    live = {**ingest.live, **{i: v for i, v in ingest.unsure.items() if i in present}}
    _check(rp, live, ingest.deleted)  # the same retriever, once Milvus is back
    assert rp.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
    rp = retriever_factory(data, _env(milvus_server))  # its start-up check repairs what the crash left
    _check(rp, live, ingest.deleted)


def test_deletes_racing_searches_never_return_a_deleted_id_across_a_restart_and_a_kill9_of_the_milvus_server(
        tmp_path: Path, retriever_factory: Factory, milvus_server: MilvusServer) -> None:
    """Two clients deleting and three searching at once over HTTP at Bounded consistency (the weakest level offered:
    a search often meets a delete Milvus has not applied yet, so the retriever's own filter is what holds), in three
    rounds: undisturbed, while the Milvus server restarts, and while it is
    killed (-9) and started again; then the retriever restarts. No id is ever returned by a search sent after its
    DELETE answered 2xx (or, for a delete whose answer was lost, after the 404 of its retry)."""
    from milvus_race import RaceLog, never_returned, race

    data, vecs = tmp_path / "pool", _vectors(1200, seed=300)
    env = {**_env(milvus_server), "T3AR_RETRIEVER_MILVUS_CONSISTENCY": "Bounded"}
    rp = retriever_factory(data, env)
    with rp.client() as c:
        ids = c.add_vectors(vecs, identity=IDENTITY)
    vectors = dict(zip(ids, vecs, strict=True))
    log = RaceLog()

    def clients() -> RetrieverClient:
        return rp.client(retries=0, timeout=ANSWER_S)

    def restart() -> None:
        time.sleep(2)
        milvus_server.restart()

    def kill9() -> None:
        time.sleep(2)
        milvus_server.kill()
        time.sleep(2)
        milvus_server.start()

    race(clients, ids[:200], vectors, log, max_seconds=180)
    assert len(log.deleted) == 200 and not log.unsure and not log.errors, (log.unsure, log.errors[:3])
    for disrupt, part in ((restart, ids[200:500]), (kill9, ids[500:800])):
        before = log.unavailable
        race(clients, part, vectors, log, pace=0.1, max_seconds=400, during=disrupt)
        _wait_serving(rp)
        assert not log.errors, log.errors[:3]
        assert set(part) <= set(log.deleted), f"{len(set(part) - set(log.deleted))} deletes never answered"
        assert log.unavailable > before, "the race did not meet the server being down"
    assert not log.violations, f"deleted ids returned after their 2xx: {log.violations[:5]}"
    assert log.searches >= 30, log.searches
    with rp.client() as c:
        assert never_returned(c, log, vectors) == []
        assert c.stats().count == 400
    assert rp.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
    rp = retriever_factory(data, env)  # and after a restart of the retriever
    with rp.client() as c:
        assert never_returned(c, log, vectors) == []
        assert c.stats().count == c.stats().index.vectors == 400

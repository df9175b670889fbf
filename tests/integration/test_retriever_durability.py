"""Restarts, crashes (kill -9) and start-up repair of a real retriever process and data directory."""

from __future__ import annotations

import hashlib
import shutil
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from t3ar.clients.retriever_errors import RetrieverError, RetrieverNotFoundError

if TYPE_CHECKING:
    from conftest import RetrieverProcess

Factory = Callable[..., "RetrieverProcess"]


def _stored_vectors(data_dir: Path, ids: list[str]) -> dict[str, bytes]:
    with sqlite3.connect(data_dir / "pool.sqlite3") as db:
        return {i: db.execute("SELECT vector FROM items WHERE seq = ?", (int(i.split("-")[1]),)).fetchone()[0]
                for i in ids}


def _disk_bytes(data_dir: Path) -> bytes:
    return b"".join(p.read_bytes() for p in data_dir.rglob("*") if p.is_file() and p.suffix != ".log")


def _integrity(data_dir: Path) -> tuple[int, int]:
    """(rows, blob files) and every row's blob exists with the right content."""
    with sqlite3.connect(data_dir / "pool.sqlite3") as db:
        shas = [r[0] for r in db.execute("SELECT sha256 FROM items")]
    for sha in shas:
        assert hashlib.sha256((data_dir / "blobs" / sha[:1] / sha).read_bytes()).hexdigest() == sha
    return len(shas), sum(1 for p in (data_dir / "blobs").rglob("*") if p.is_file())


def _started_with(retriever_factory: Factory, data: Path, make_png: Callable[..., bytes],
                  n: int) -> tuple[RetrieverProcess, list[str]]:
    """A retriever on ``data`` holding ``n`` numbered images (``0.png`` …), and their ids in order."""
    rp = retriever_factory(data)
    with rp.client() as c:
        return rp, [it.id for it in c.add_images([(f"{i}.png", make_png(i)) for i in range(n)]).items]


@pytest.mark.slow
def test_graceful_restart_keeps_state_and_deleted_bytes_leave_the_disk(
        tmp_path: Path, retriever_factory: Factory, make_png: Callable[..., bytes]) -> None:
    data = tmp_path / "pool"
    rp, ids = _started_with(retriever_factory, data, make_png, 12)
    gone = ids[:3]
    vectors = _stored_vectors(data, gone)
    with rp.client() as c:
        c.delete(gone[0])
        c.delete_many(gone[1:])
        queries = c.embed([make_png(i) for i in range(3)])
    assert rp.stop(signal.SIGTERM) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after a clean stop
    assert (data / "index" / "faiss.index").exists() and (data / "index" / "faiss.index.marker.json").exists()
    on_disk = _disk_bytes(data)
    assert all(v not in on_disk for v in vectors.values()), "a deleted embedding is still on disk"
    rp = retriever_factory(data)
    with rp.client() as c:
        st = c.stats()
        assert st.count == 9 and st.repairs == []  # the saved index matched the database
        assert all(i not in row for row in c.search(queries, k=100).ids for i in gone)
        for i in gone:
            with pytest.raises(RetrieverNotFoundError):
                c.get_item(i)
        assert [it.id for it in c.iter_items()] == ids[3:]
    assert _integrity(data) == (9, 9)


def test_crash_with_stale_saved_index_is_repaired_and_deletes_stay_deleted(
        tmp_path: Path, retriever_factory: Factory) -> None:
    """A vectors-only pool (fast start; the repair logic does not depend on the embedder)."""
    data = tmp_path / "pool"
    env = {"T3AR_RETRIEVER_EMBEDDER": "none", "T3AR_RETRIEVER_VECTOR_DIM": "32",
           "T3AR_RETRIEVER_VECTOR_IDENTITY": "synthetic-32"}
    vecs = np.random.default_rng(0).standard_normal((9, 32)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    rp = retriever_factory(data, env)
    with rp.client() as c:
        ids = c.add_vectors(vecs[:8], identity="synthetic-32")
    assert rp.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
    stale = tmp_path / "stale-index"
    shutil.copytree(data / "index", stale)  # a saved index that still contains ids[0]
    rp = retriever_factory(data, env)
    with rp.client() as c:
        assert c.stats().repairs == []
        c.delete(ids[0])
        new_id = c.add_vectors(vecs[8:], identity="synthetic-32")[0]
    rp.stop(signal.SIGKILL)
    shutil.rmtree(data / "index")
    shutil.copytree(stale, data / "index")  # the worst case: an old index file next to a newer database
    orphan = "ab" + "0" * 62
    (data / "blobs" / "a" / orphan).write_bytes(b"left over by a crash before its commit")
    rp = retriever_factory(data, env)
    with rp.client() as c:
        repairs = " | ".join(c.stats().repairs)
        assert "rebuilt the index" in repairs and "generation" in repairs and "orphan" in repairs
        found = c.search(vecs[:1], k=100).ids[0]
        assert ids[0] not in found and new_id in found and set(ids[1:]) <= set(found)
        assert c.stats().count == 8
    assert not (data / "blobs" / "a" / orphan).exists()


@pytest.mark.slow
def test_kill9_during_ingest_loses_no_acknowledged_item(
        tmp_path: Path, retriever_factory: Factory, make_png: Callable[..., bytes]) -> None:
    data = tmp_path / "pool"
    rp = retriever_factory(data, {"T3AR_RETRIEVER_DUPLICATE_POLICY": "keep"})
    acked: dict[str, str] = {}  # id -> sha256, only for 2xx answers
    stop = threading.Event()
    failures: list[str] = []

    def ingest() -> None:
        seed = 1000
        with rp.client(retries=0, timeout=30) as c:
            while not stop.is_set():
                batch = [(f"{s}.png", make_png(s)) for s in range(seed, seed + 4)]
                seed += 4
                try:
                    rep = c.add_images(batch)
                except RetrieverError as e:
                    failures.append(str(e))
                    return
                acked.update({it.id: it.sha256 for it in rep.items if it.status == "added"})

    worker = threading.Thread(target=ingest)
    worker.start()
    deadline = time.monotonic() + 60
    while len(acked) < 40 and time.monotonic() < deadline:
        time.sleep(0.05)
    rp.stop(signal.SIGKILL)  # mid-ingest: the thread is always sending
    stop.set()
    worker.join(timeout=30)
    assert len(acked) >= 40 and failures, "the ingest should have been cut off by the kill"
    rp = retriever_factory(data)
    with rp.client() as c:
        assert c.stats().count >= len(acked)
        for item_id, sha in acked.items():
            assert c.get_item(item_id).sha256 == sha
        present = {it.id for it in c.iter_items()}
        assert set(acked) <= present
        assert c.stats().index.vectors == len(present)
    rows, blobs = _integrity(data)
    assert rows == blobs == len(present)


@pytest.mark.slow
def test_other_embedder_is_refused_then_reembedded(
        tmp_path: Path, retriever_factory: Factory, make_png: Callable[..., bytes]) -> None:
    data = tmp_path / "pool"
    rp, ids = _started_with(retriever_factory, data, make_png, 4)
    with rp.client() as c:
        old_identity = c.stats().identity
    rp.stop(signal.SIGTERM)
    other = {"T3AR_RETRIEVER_EMBEDDER_IMAGE_SIZE": "64"}
    refused = retriever_factory(data, other, wait=None)
    assert refused.proc.wait(timeout=120) != 0
    log = refused.log()
    new_identity = old_identity.replace(":96px", ":64px")
    assert old_identity in log and new_identity in log and "T3AR_RETRIEVER_REEMBED_ON_START" in log
    rp = retriever_factory(data, {**other, "T3AR_RETRIEVER_REEMBED_ON_START": "true"})
    with rp.client() as c:
        st = c.stats()
        assert st.identity == new_identity and any("re-embedded 4" in r for r in st.repairs)
        assert [it.id for it in c.iter_items()] == ids
        assert c.search_images([make_png(2)], k=1).ids[0] == [ids[2]]

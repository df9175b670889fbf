"""The Milvus backend made to agree with the database: at start-up (:func:`open_synced`), at a clean shutdown
(:func:`mark_synced`), ahead of time (``t3ar pool migrate``: :func:`sync`), and its life in the service
(:class:`MilvusBackend`). SQLite stays the source of truth (:mod:`t3ar_services.retriever.backend`)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from t3ar_services.retriever.backend import MilvusIndex

log = logging.getLogger(__name__)

SYNC_MARK = "milvus_synced"  # SQLite meta: "<collection>:<generation>" written at a clean shutdown


def sync(index: MilvusIndex, store: Any, dim: int) -> tuple[int, int]:
    """Make the collection hold exactly the database's ids with their stored vectors (idempotent and
    resumable: only what differs is written). Returns (inserted, removed)."""
    have = index.live_ids()
    uniq, counts = np.unique(have, return_counts=True)
    doubled = uniq[counts > 1]  # an insert retried after a lost answer: remove and insert once
    want = store.all_seqs()
    extra = np.union1d(np.setdiff1d(uniq, want, assume_unique=True), doubled)
    if len(extra):
        index.remove(extra.tolist())
    missing = np.union1d(np.setdiff1d(want, uniq, assume_unique=True), np.intersect1d(doubled, want))
    if len(missing):
        for seqs, vecs in store.iter_vectors(dim):
            m = np.isin(seqs, missing)
            if m.any():
                index.add(seqs[m], vecs[m])
    if index.flush_rows and index._unflushed:
        index.flush()
    index.resync_count()
    return int(len(missing)), int(len(extra))


def open_synced(index: MilvusIndex, store: Any, dim: int, repairs: list[str]) -> None:
    """Start-up: trust the collection when the last shutdown was clean and nothing was written since (the
    mark names this collection and the current generation, and the counts agree), else synchronise it with
    the database. The mark is removed at once: a crash from here on means a check at the next start."""
    mark = store.meta().get(SYNC_MARK, "")
    state = store.state()
    if mark == f"{index.collection}:{state.generation}" and index.count == state.count:
        log.info("Milvus collection %s agrees with the database (%d vectors)", index.collection, state.count)
    else:
        inserted, removed = sync(index, store, dim)
        if inserted or removed:
            msg = (f"synchronised Milvus collection {index.collection} with the database: inserted {inserted}, "
                   f"removed {removed} vector(s)")
            repairs.append(msg)
            log.warning("start-up repair: %s", msg)
    if mark:
        store.set_meta({SYNC_MARK: ""})
    if index.count != state.count:
        raise RuntimeError(f"Milvus collection {index.collection} holds {index.count} vectors, the database "
                           f"{state.count}")


def mark_synced(index: MilvusIndex, store: Any) -> None:
    """Clean shutdown: record that the collection equals the database at this generation (not after a
    failed Milvus call: then the next start checks)."""
    if index.failed:
        return
    store.set_meta({SYNC_MARK: f"{index.collection}:{store.state().generation}"})


class MilvusBackend:
    """The milvus backend's life in the service: connect at start (refuse to start without it), make the
    collection agree with the database in the loader, mark it in sync and close it at shutdown."""

    trains = False  # Milvus builds its own index

    def __init__(self, index: MilvusIndex, target: str) -> None:
        self.index = index
        log.info("pool backend: Milvus collection %s at %s", index.collection, target)

    def load(self, pool: Any, reembedded: bool) -> None:
        if reembedded:  # the collection holds the old vectors under the same ids: replace them all
            self.index.remove(self.index.live_ids().tolist())
        open_synced(self.index, pool.store, pool.info.dim, pool.info.repairs)
        pool.index = self.index

    def close(self, pool: Any, loaded: bool) -> None:
        if loaded:
            try:
                mark_synced(self.index, pool.store)
            except Exception:
                log.exception("could not mark the Milvus collection in sync; the next start checks it")
        self.index.close()

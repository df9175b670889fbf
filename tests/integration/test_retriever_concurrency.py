"""8 searcher threads against a real retriever while other threads add and delete, for a bounded time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from t3ar.clients.retriever import RetrieverClient

if TYPE_CHECKING:
    from conftest import RetrieverProcess

RUN_SECONDS = 5.0


@pytest.mark.slow
def test_searches_concurrent_with_adds_and_deletes_never_return_acknowledged_deletes(
        tmp_path: Path, retriever_factory: Callable[..., RetrieverProcess], make_png: Callable[..., bytes]) -> None:
    rp = retriever_factory(tmp_path / "pool", {"T3AR_RETRIEVER_COMPACT_IDLE_SECONDS": "0.3",
                                               "T3AR_RETRIEVER_COMPACT_THRESHOLD": "4",
                                               "T3AR_RETRIEVER_DUPLICATE_POLICY": "keep"})
    with rp.client() as c:
        victims = [it.id for it in c.add_images([(f"v{i}.png", make_png(i)) for i in range(30)]).items]
        queries = c.embed([make_png(i) for i in range(30)])  # each victim is its own query's top hit

    acked_delete: dict[str, float] = {}  # id -> monotonic time its DELETE returned 2xx
    searches: list[tuple[float, list[list[str]]]] = []  # (time the request was sent, results)
    errors: list[str] = []
    added: list[str] = []
    stop = threading.Event()
    lock = threading.Lock()

    def guarded(fn: Callable[[RetrieverClient], None], token: str) -> Callable[[], None]:
        def run() -> None:
            with RetrieverClient(rp.url, token, retries=0, timeout=60) as client:
                try:
                    while not stop.is_set():
                        fn(client)
                except Exception as e:  # any error fails the test
                    errors.append(f"{threading.current_thread().name}: {type(e).__name__}: {e}")
        return run

    rng = np.random.default_rng(0)

    def search(client: RetrieverClient) -> None:
        pick = rng.choice(len(queries), size=4, replace=False)
        sent = time.monotonic()
        res = client.search(queries[pick], k=5)
        with lock:
            searches.append((sent, res.ids))

    def delete(client: RetrieverClient) -> None:
        if len(acked_delete) < len(victims) - 5:
            victim = victims[len(acked_delete)]
            client.delete(victim)
            acked_delete[victim] = time.monotonic()
        time.sleep(0.05)

    seeds = iter(range(100, 10_000))

    def add(client: RetrieverClient) -> None:
        rep = client.add_images([(f"n{s}.png", make_png(s)) for s in (next(seeds), next(seeds))])
        added.extend(it.id for it in rep.items if it.id)

    threads = [threading.Thread(target=guarded(search, "test-rw-token"), name=f"search-{i}") for i in range(8)]
    threads += [threading.Thread(target=guarded(delete, "test-admin-token"), name="delete"),
                threading.Thread(target=guarded(add, "test-rw-token"), name="add")]
    for t in threads:
        t.start()
    time.sleep(RUN_SECONDS)
    stop.set()
    for t in threads:
        t.join(timeout=60)

    assert not errors, errors[:5]
    assert len(searches) > 50 and len(acked_delete) >= 10 and len(added) >= 4
    violations = [(sent, pid) for sent, ids in searches for row in ids for pid in row
                  if pid in acked_delete and acked_delete[pid] < sent]
    assert not violations, f"{len(violations)} results named an id whose DELETE was already acknowledged"
    with rp.client() as c:
        final = c.search(queries, k=50).ids
        assert not {pid for row in final for pid in row} & set(acked_delete)
        st = c.stats()
        assert st.count == 30 - len(acked_delete) + len(added) == st.index.vectors

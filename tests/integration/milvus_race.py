"""Deletes and searches interleaved from several clients over real HTTP, for the milvus backend's deletion
guarantee (a deleted id never comes back after its 2xx): shared by the milvus-lite test (normal suite) and the real
server's (``milvus_server``), which also restarts and kill -9s the server in the middle of a race.

Each deleter thread owns its own slice of the pool's ids and deletes them one by one, recording an id as deleted
only once its DELETE answered 2xx. Each searcher thread queries the vectors of the ids deleted last and of those
about to be deleted (the searches most likely to meet a delete Milvus has not applied yet at Bounded consistency),
and checks every answer against the ids whose 2xx had arrived before that search was sent. Calls answered 503
(Milvus down) are counted; a delete answered 503 may or may not have happened, so its id is ``unsure`` and the
delete is sent again until it is answered: 2xx (deleted from then on) or 404 (it had happened: deleted from the
404 on, the strictest reading). Bounded: each deleter stops after its slice, the searchers stop with the last
deleter, and the whole race with ``max_seconds``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from t3ar.clients.retriever import RetrieverClient
from t3ar.clients.retriever_errors import RetrieverError, RetrieverNotFoundError, RetrieverUnavailableError


@dataclass
class RaceLog:
    """What a race saw (shared by its threads, guarded by ``lock``)."""

    deleted: dict[str, float] = field(default_factory=dict)  # id -> when its 2xx arrived (monotonic)
    unsure: set[str] = field(default_factory=set)  # a delete without an answer (503 / connection cut)
    recent: list[str] = field(default_factory=list)  # deleted ids, in the order their 2xx arrived
    violations: list[tuple[str, float]] = field(default_factory=list)  # (id, seconds after its 2xx)
    searches: int = 0
    unavailable: int = 0  # calls answered 503 (Milvus down or coming back)
    errors: list[str] = field(default_factory=list)  # anything else: a failure of the race
    lock: threading.Lock = field(default_factory=threading.Lock)


def race(make_client: Callable[[], RetrieverClient], ids: list[str], vectors: dict[str, np.ndarray], log: RaceLog, *,
         deleters: int = 2, searchers: int = 3, k: int = 10, pace: float = 0.0, max_seconds: float = 120.0,
         during: Callable[[], None] | None = None) -> None:
    """Run one race over ``ids`` (deleting them, ``deleters`` slices, ``pace`` seconds between one deleter's
    deletes) into ``log``; ``during``, when given, runs in the calling thread while the race goes on (e.g. a restart
    of the Milvus server), and the race ends after it too."""
    slices = [ids[i::deleters] for i in range(deleters)]
    stop = threading.Event()
    deadline = time.monotonic() + max_seconds
    deleting = [True] * deleters
    disrupting = threading.Event()  # ``during`` runs
    upcoming = [list(s) for s in slices]

    def deleter(i: int) -> None:
        try:
            delete_all(i)
        except Exception as e:  # a failure of the race (a 500, a 4xx other than the 404 above)
            with log.lock:
                log.errors.append(f"deleter {i}: {type(e).__name__}: {e}")
        finally:
            deleting[i] = False

    def delete_all(i: int) -> None:
        with make_client() as c:
            todo = upcoming[i]
            while todo and not stop.is_set() and time.monotonic() < deadline:
                victim = todo[0]
                try:
                    c.delete(victim)
                except RetrieverUnavailableError:  # sent again: it may or may not have happened meanwhile
                    with log.lock:
                        log.unavailable += 1
                        log.unsure.add(victim)
                    time.sleep(0.2)
                    continue
                except RetrieverNotFoundError:  # only after an unanswered delete of it, which had happened
                    with log.lock:
                        if victim not in log.unsure:
                            log.errors.append(f"delete {victim}: 404 without an earlier unanswered delete")
                with log.lock:
                    log.unsure.discard(victim)
                    log.deleted[victim] = time.monotonic()
                    log.recent.append(victim)
                todo.pop(0)
                if pace:
                    time.sleep(pace)

    def searcher(seed: int) -> None:
        try:
            search_until_done(seed)
        except Exception as e:
            with log.lock:
                log.errors.append(f"searcher {seed}: {type(e).__name__}: {e}")

    def search_until_done(seed: int) -> None:
        rng = np.random.default_rng(seed)
        with make_client() as c:
            while not stop.is_set() and time.monotonic() < deadline:
                with log.lock:
                    acked = dict(log.deleted)  # every 2xx that arrived before this search is sent
                    last = log.recent[-4:]
                nxt = [v for u in upcoming for v in u[:1]]
                pick = last + nxt + [ids[int(j)] for j in rng.integers(0, len(ids), 2)]
                try:
                    res = c.search(np.stack([vectors[p] for p in pick]), k)
                except RetrieverUnavailableError:
                    with log.lock:
                        log.unavailable += 1
                    time.sleep(0.2)
                    continue
                except RetrieverError as e:
                    with log.lock:
                        log.errors.append(f"search: {type(e).__name__}: {e}")
                    return
                now = time.monotonic()
                with log.lock:
                    log.searches += 1
                    log.violations += [(i, now - acked[i]) for row in res.ids for i in row if i in acked]
                if not any(deleting) and not disrupting.is_set():
                    return

    threads = [threading.Thread(target=deleter, args=(i,), daemon=True) for i in range(deleters)]
    threads += [threading.Thread(target=searcher, args=(s,), daemon=True) for s in range(searchers)]
    if during is not None:
        disrupting.set()
    for t in threads:
        t.start()
    try:
        if during is not None:
            try:
                during()
            finally:
                disrupting.clear()
    finally:
        for t in threads[:deleters]:
            t.join(timeout=max(1.0, deadline - time.monotonic() + 30))
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a race thread did not stop"


def never_returned(client: RetrieverClient, log: RaceLog, vectors: dict[str, np.ndarray], k: int = 10) -> list[str]:
    """Deleted ids (2xx) that a search for their own vectors returns now (must be empty)."""
    gone = sorted(log.deleted)
    found: set[str] = set()
    for start in range(0, len(gone), 256):
        part = gone[start:start + 256]
        found |= {i for row in client.search(np.stack([vectors[p] for p in part]), k).ids for i in row}
    return sorted(found & set(gone))

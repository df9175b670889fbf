"""The feed of withdrawn pool ids from the API to the workers' image caches (a contract module: the API publishes,
workers read; neither imports the other).

Redis holds a sorted set of withdrawn ids (:data:`LOG_KEY`), each scored by a sequence number (:data:`SEQ_KEY`)
given in publishing order, and a floor (:data:`FLOOR_KEY`): every entry at or below it was trimmed. A worker keeps
the highest sequence number it has applied (its watermark, on its cache's disk) and reads only the entries above
it, so a job's start-up work is the withdrawals since the last job, however long the pool's history.

The log is trimmed to its newest :data:`KEEP` entries, so what Redis holds stays bounded too. A cache whose
watermark is below the floor may have missed trimmed ids: it is told to drop everything (it is only a cache),
never to keep a withdrawn image. One process publishes (the API serving the queue; a lock orders its threads),
so entries appear in sequence order.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

LOG_KEY = "t3ar:pool:withdrawn:log"  # sorted set: pool id -> sequence number
SEQ_KEY = "t3ar:pool:withdrawn:seq"  # the last sequence number given
FLOOR_KEY = "t3ar:pool:withdrawn:floor"  # entries at or below this were trimmed
KEEP = 100_000  # entries the log keeps (about 10 MB of Redis)

_publishing = threading.Lock()


@dataclass(frozen=True)
class Feed:
    """What a cache must forget: ``ids`` (withdrawn since its watermark), or everything when ``reset`` (its
    watermark is below the floor); ``upto`` is its new watermark."""

    ids: list[str]
    upto: int
    reset: bool


def publish(redis: Any, ids: Sequence[str], *, keep: int = KEEP) -> None:
    """Append ``ids`` to the log and trim it to its newest ``keep`` entries. Raises what Redis raises."""
    if not ids:
        return
    with _publishing:
        end = int(redis.incrby(SEQ_KEY, len(ids)))
        redis.zadd(LOG_KEY, {pid: end - len(ids) + 1 + i for i, pid in enumerate(ids)})
        excess = int(redis.zcard(LOG_KEY)) - keep
        if excess > 0:
            cut = redis.zrange(LOG_KEY, excess - 1, excess - 1, withscores=True)
            if cut:
                floor = int(cut[0][1])
                redis.set(FLOOR_KEY, max(floor, int(redis.get(FLOOR_KEY) or 0)))  # raised before entries go
                redis.zremrangebyscore(LOG_KEY, "-inf", floor)


def was_withdrawn(redis: Any, pool_id: str) -> bool:
    """Whether ``pool_id`` is in the log (withdrawn within its newest :data:`KEEP` entries). Raises what Redis
    raises."""
    return redis.zscore(LOG_KEY, pool_id) is not None


def read(redis: Any, after: int) -> Feed:
    """The ids withdrawn after watermark ``after`` (see :class:`Feed`)."""
    pipe = redis.pipeline(transaction=True)
    pipe.get(FLOOR_KEY)
    pipe.zrangebyscore(LOG_KEY, f"({after}", "+inf", withscores=True)
    floor_raw, entries = pipe.execute()
    floor = int(floor_raw or 0)
    ids = [m.decode() if isinstance(m, bytes) else str(m) for m, _ in entries]
    upto = max([after, floor, *(int(score) for _, score in entries)])
    return Feed(ids, upto, reset=after < floor)


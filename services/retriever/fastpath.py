"""The lean path of ``POST /search``: the common request answered without FastAPI's per-request machinery.

Profiled on the 2-core development machine (py-spy, a vectors-only service, single 512-d queries against 1,000
vectors): about three quarters of the service's CPU per request was FastAPI around the route (dependency
solving with its cache keys and security scopes ~35 %, routing ~10 %, the body model, the thread-pool hop
and the ``Response`` plumbing), the search itself under a tenth. :class:`SearchAnswer` takes a
``POST /search`` whose JSON body it fully understands, i.e. ``vectors_b64`` queries with fields of exactly
the documented types (what :class:`~t3ar.clients.retriever.RetrieverClient` sends), and answers it with the
same code and the same bytes as the route. Everything else (JSON ``vectors``, ``images_b64``, odd types,
unparsable bodies) and every request that fails here in any way is handed to the regular route with its body
replayed, so answers and errors are exactly the route's: the OpenAPI contract does not change.

It is called by the outermost layer of the middleware stack (:class:`~t3ar_services.common.fastlane.FastLane`),
which does the request id, access log, metrics, credentials and body limit inline for this one route: the four
middleware layers cost more CPU per single query than a search of a small pool. Auth: only a request with a
known token (or with auth disabled) gets here, and ``/search`` needs no more than a known token.

Scheduling: a search that costs little (:data:`INLINE_MAX_COST` multiply-adds, ~1 ms) runs on the event loop,
saving two thread wake-ups, unless a writer holds the index lock; larger ones run in the thread pool so that
concurrent requests keep being served (faiss releases the GIL).
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.concurrency import run_in_threadpool

from t3ar_services.common.offloop import OFFLOOP_BYTES
from t3ar_services.retriever import schemas as s
from t3ar_services.retriever.deps import RetrieverState
from t3ar_services.retriever.index import IndexBusy
from t3ar_services.retriever.routes import search_json, search_queries

INLINE_MAX_COST = 4e6  # multiply-adds: ~1 ms of a one-thread scan on this class of CPU
_FIELDS = frozenset(s.SearchRequest.model_fields)


def _limit(field: str, name: str, default: int) -> int:
    """A bound of the request model's field (``ge``, ``le``, ``max_length``): the lean path never accepts what
    the model would refuse."""
    for meta in s.SearchRequest.model_fields[field].metadata:
        value = getattr(meta, name, None)
        if value is not None:
            return int(value)
    return default


_R = (_limit("r", "ge", 1), _limit("r", "le", 1))
_SEED = (_limit("seed", "ge", 0), _limit("seed", "le", 0))
_MAX_EXCLUDE = _limit("exclude_ids", "max_length", 0)


class SearchAnswer:
    """``answer(body)`` of the :class:`~t3ar_services.common.fastlane.FastLane` for ``POST /search``: the
    route's JSON answer, or None to let the route handle the request."""

    def __init__(self, state: RetrieverState) -> None:
        self.state = state

    async def __call__(self, raw: bytes) -> bytes | None:
        state = self.state
        pool = state.pool
        if pool is None or pool.index is None or state.load_error:
            return None
        # a large body is parsed in the thread pool: never seconds of parsing on the event loop
        body = _parse(raw) if len(raw) <= OFFLOOP_BYTES else await run_in_threadpool(_parse, raw)
        if body is None:
            return None
        try:
            queries = search_queries(pool, state, state.settings, body)
            answer = None
            if pool.index.scan_cost(len(queries)) <= INLINE_MAX_COST:
                try:
                    answer = search_json(pool, state, state.settings, body, queries, blocking=False)
                except IndexBusy:
                    pass
            if answer is None:
                answer = await run_in_threadpool(search_json, pool, state, state.settings, body, queries)
        except Exception:  # the route gives the documented answer (a 4xx, or the same failure)
            return None
        state.fast_searches += 1
        return answer


def _int(value: Any, lo: int, hi: int) -> bool:
    return type(value) is int and lo <= value <= hi


def _opt_str(value: Any) -> bool:
    return value is None or type(value) is str


def _parse(raw: bytes) -> s.SearchRequest | None:
    """A SearchRequest when ``raw`` is a body the route's model accepts with exactly these values and that
    asks with ``vectors_b64``; None for anything else (the route decides)."""
    try:
        doc = orjson.loads(raw)  # what it refuses that json.loads takes (NaN, huge ints) goes to the route
    except orjson.JSONDecodeError:
        return None
    if type(doc) is not dict or not doc.keys() <= _FIELDS or type(doc.get("vectors_b64")) is not str \
            or doc.get("vectors") is not None or doc.get("images_b64") is not None:
        return None
    k, r, seed = doc.get("k", 10), doc.get("r", 1), doc.get("seed", 0)
    exclude = doc.get("exclude_ids", [])
    source, identity = doc.get("source"), doc.get("identity")
    if not (_int(k, -2**63, 2**63 - 1) and _int(r, *_R) and _int(seed, *_SEED)
            and type(exclude) is list and len(exclude) <= _MAX_EXCLUDE and all(type(x) is str for x in exclude)
            and _opt_str(source) and _opt_str(identity)):
        return None
    return s.SearchRequest.model_construct(vectors=None, vectors_b64=doc["vectors_b64"], images_b64=None, k=k, r=r,
                                           seed=seed, exclude_ids=exclude, source=source, identity=identity)

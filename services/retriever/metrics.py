"""Prometheus metrics of the retriever (the request timing and its middleware: :mod:`t3ar_services.common.metrics`)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import Counter, Gauge

from t3ar_services.common.metrics import ServiceMetrics

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class RetrieverMetrics(ServiceMetrics):
    def __init__(self) -> None:
        super().__init__("t3ar_retriever", _BUCKETS)
        r = self.registry
        self.pool_items = Gauge("t3ar_retriever_pool_items", "items in the pool", registry=r)
        self.index_vectors = Gauge("t3ar_retriever_index_vectors", "live vectors in the faiss index", registry=r)
        self.searches = Counter("t3ar_retriever_searches", "search requests", registry=r)
        self.search_queries = Counter("t3ar_retriever_search_queries", "query vectors searched", registry=r)
        self.adds = Counter("t3ar_retriever_adds", "uploaded items by outcome", ["status"], registry=r)
        self.deletes = Counter("t3ar_retriever_deletes", "items deleted", registry=r)
        self.embedded = Counter("t3ar_retriever_embedded_images", "images embedded for /embed and /search",
                                registry=r)
        self.repairs = Counter("t3ar_retriever_startup_repairs", "start-up repairs (index rebuilds, orphan "
                               "sweeps)", registry=r)

    def bind_pool(self, count: Callable[[], float], vectors: Callable[[], float]) -> None:
        self.pool_items.set_function(count)
        self.index_vectors.set_function(vectors)

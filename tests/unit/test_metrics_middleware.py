"""The request histogram's labels: the route template and the status the app answered with (500 when it raised
before answering)."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from t3ar_services.common.metrics import MetricsMiddleware, ServiceMetrics


def _item(request: Request) -> PlainTextResponse:
    if request.path_params["name"] == "boom":
        raise RuntimeError("boom")
    return PlainTextResponse("gone", status_code=410)


def test_the_histogram_counts_each_request_under_its_route_and_status() -> None:
    metrics = ServiceMetrics("t", buckets=(1.0,))
    app = Starlette(routes=[Route("/items/{name}", _item)])
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    client = TestClient(app)
    assert client.get("/items/a").status_code == 410
    with pytest.raises(RuntimeError):
        client.get("/items/boom")

    def count(status: str) -> float | None:
        return metrics.registry.get_sample_value("t_request_seconds_count",
                                                 {"method": "GET", "route": "/items/{name}", "status": status})

    assert count("410") == 1 and count("500") == 1

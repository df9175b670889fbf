"""The CLI's API client sends job and pool ids as one percent-encoded path segment (like the retriever client),
so an id holding '/', '?', '#', '..' or a control character reaches the API as given; an empty id is unknown
without a request."""

from __future__ import annotations

import httpx
import pytest

from t3ar.clients.api import ApiClient, ApiNotFoundError


@pytest.mark.parametrize(("given", "raw"), [("j1", "j1"), ("a/b?c#d", "a%2Fb%3Fc%23d"), ("..", "%2E%2E"),
                                            ("x\x04y", "x%04y"), ("p 1", "p%201")])
def test_ids_travel_as_one_encoded_path_segment(given: str, raw: str) -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.raw_path.decode()}")
        return httpx.Response(200, json={"status": "finished"})

    api = ApiClient("http://api", "t", transport=httpx.MockTransport(handler), retries=0)
    api.job(given)
    api.cancel(given)
    api.report(given)
    api.readapt(given)
    api.delete_pool_item(given)
    api.lineage(given)
    assert seen == [f"GET /jobs/{raw}", f"POST /jobs/{raw}/cancel", f"GET /jobs/{raw}/report",
                    f"POST /jobs/{raw}/readapt", f"DELETE /pool/{raw}", f"GET /pool/{raw}/lineage"]


def test_an_empty_id_is_unknown_without_a_request() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"no request expected, got {request.url}")

    api = ApiClient("http://api", "t", transport=httpx.MockTransport(handler), retries=0)
    for call in (api.job, api.cancel, api.report, api.readapt, api.delete_pool_item, api.lineage):
        with pytest.raises(ApiNotFoundError, match="never empty"):
            call("")

"""The CLI's API client sends job and pool ids as one percent-encoded path segment (like the retriever client),
so an id holding '/', '?', '#', '..' or a control character reaches the API as given; an empty id is unknown
without a request."""

from __future__ import annotations

import httpx
import pytest

from t3ar.clients.api import ApiClient, ApiError, ApiNotFoundError


@pytest.mark.parametrize(("given", "raw"), [("j1", "j1"), ("a/b?c#d", "a%2Fb%3Fc%23d"), ("..", "%2E%2E"),
                                            ("x\x04y", "x%04y"), ("p 1", "p%201")])
def test_ids_travel_as_one_encoded_path_segment(given: str, raw: str) -> None:
    seen: list[str] = []

    target = {"images": 2, "labelled": False, "skipped": 0}
    contribution = {"requested": False, "status": "not_requested"}
    answers = {"GET /jobs/": {"id": "j", "url": "u", "status": "finished", "model_id": "m", "created_at": "t",
                              "config": {}, "target": target, "contribution": contribution},
               "POST /jobs/cancel": {"id": "j", "status": "canceled"},
               "GET /jobs/report": {"job_id": "j", "contribution": contribution},
               "POST /jobs/readapt": {"id": "j2", "url": "u", "config": {}, "target": target},
               "DELETE /pool/": {"pool_id": "p", "jobs": []}, "GET /pool/lineage": {"pool_id": "p", "jobs": []}}

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.raw_path.decode()
        seen.append(f"{request.method} {path}")
        parts = path.split("/")
        return httpx.Response(200, json=answers[f"{request.method} /{parts[1]}/{parts[3] if len(parts) > 3 else ''}"])

    api = ApiClient("http://api", "t", transport=httpx.MockTransport(handler), retries=0)
    api.job(given)
    api.cancel(given)
    api.report(given)
    api.readapt(given)
    api.delete_pool_item(given)
    api.lineage(given)
    assert seen == [f"GET /jobs/{raw}", f"POST /jobs/{raw}/cancel", f"GET /jobs/{raw}/report",
                    f"POST /jobs/{raw}/readapt", f"DELETE /pool/{raw}", f"GET /pool/{raw}/lineage"]


def test_an_answer_that_does_not_fit_is_an_api_error_naming_the_model() -> None:
    api = ApiClient("http://api", "t", retries=0,
                    transport=httpx.MockTransport(lambda request: httpx.Response(200, json={"status": "done"})))
    with pytest.raises(ApiError, match="does not fit JobOut"):
        api.job("j1")


def test_an_empty_id_is_unknown_without_a_request() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"no request expected, got {request.url}")

    api = ApiClient("http://api", "t", transport=httpx.MockTransport(handler), retries=0)
    for call in (api.job, api.cancel, api.report, api.readapt, api.delete_pool_item, api.lineage):
        with pytest.raises(ApiNotFoundError, match="never empty"):
            call("")

"""RetrieverClient retry and error mapping, against httpx.MockTransport (no server)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import numpy as np
import pytest
from retriever_answers import item_json, stats_json

from t3ar.clients.retriever import RetrieverClient, RetrieverProvider
from t3ar.clients.retriever_errors import (
    RetrieverArchiveError,
    RetrieverAuthError,
    RetrieverConflictError,
    RetrieverError,
    RetrieverImageError,
    RetrieverInputError,
    RetrieverNotFoundError,
    RetrieverUnavailableError,
)
from t3ar.errors import ImageDecodeError, InvalidInputError, UnsafeArchiveError


def _client(handler: Callable[[httpx.Request], httpx.Response], retries: int = 3) -> RetrieverClient:
    return RetrieverClient("http://retriever", "tok", retries=retries, backoff=0.001,
                           transport=httpx.MockTransport(handler))


def _err(status: int, code: str, message: str = "what to fix") -> httpx.Response:
    return httpx.Response(status, json={"error": {"code": code, "message": message}})


def test_transient_failures_are_retried_then_succeed() -> None:
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        assert request.headers["authorization"] == "Bearer tok"
        if len(calls) == 1:
            raise httpx.ConnectError("refused")
        if len(calls) == 2:
            return httpx.Response(503, headers={"Retry-After": "0"}, json={"error": {"code": "not_ready",
                                                                                   "message": "loading"}})
        if len(calls) == 3:
            return httpx.Response(502, text="bad gateway")
        return httpx.Response(200, json=stats_json(3, "r"))

    assert _client(handler).stats().count == 3 and len(calls) == 4


def test_gives_up_after_retries_with_unavailable() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    with pytest.raises(RetrieverUnavailableError, match="unreachable"):
        _client(handler, retries=2).stats()


def test_unsafe_calls_are_not_retried_after_the_request_may_have_run() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        raise httpx.ReadTimeout("slow")

    with pytest.raises(RetrieverUnavailableError):
        _client(handler).add_vectors(np.zeros((1, 4), np.float32), identity="x")
    assert calls == 1


def test_delete_retry_that_finds_the_item_gone_counts_as_done() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise httpx.ReadTimeout("the first attempt ran but its answer was lost")
        return _err(404, "not_found", "no item")

    _client(handler).delete("abc-1")
    assert calls == 2
    with pytest.raises(RetrieverNotFoundError):
        _client(lambda r: _err(404, "not_found", "no item 'abc-1'")).delete("abc-1")


@pytest.mark.parametrize(("status", "code", "classes"), [
    (422, "bad_image", (RetrieverImageError, ImageDecodeError, InvalidInputError)),
    (422, "unsafe_archive", (RetrieverArchiveError, UnsafeArchiveError)),
    (404, "not_found", (RetrieverNotFoundError, InvalidInputError)),
    (401, "unauthorized", (RetrieverAuthError,)),
    (403, "forbidden", (RetrieverAuthError,)),
    (409, "identity_mismatch", (RetrieverConflictError,)),
    (413, "payload_too_large", (RetrieverInputError,)),
    (422, "items_rejected", (RetrieverInputError,)),
])
def test_errors_map_to_core_exceptions_with_the_server_message(status: int, code: str,
                                                                classes: tuple[type, ...]) -> None:
    with pytest.raises(classes[0]) as info:
        _client(lambda r: _err(status, code, "the server says why")).get_item("x-1")
    err = info.value
    assert all(isinstance(err, c) for c in classes) and isinstance(err, RetrieverError)
    assert "the server says why" in str(err) and err.status == status and err.code == code


def test_provider_pads_short_rows_and_checks_input() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"identity": "r", "k": 3,
                                         "results": [{"ids": ["t-1"], "scores": [0.9]}] * 2})

    provider = RetrieverProvider(_client(handler))
    scores, ids = provider.search(np.ones((2, 4), np.float32), 3)
    assert ids == [["t-1", "", ""]] * 2 and scores[0, 0] == pytest.approx(0.9) and np.isneginf(scores[0, 1])
    import torch

    with pytest.raises(ValueError, match="uint8"):
        provider.embed(torch.zeros(1, 3, 8, 8))


@pytest.mark.parametrize(("item_id", "raw"), [
    ("ab12cd-7", "ab12cd-7"), ("\x04", "%04"), ("a/b", "a%2Fb"), ("p?x=1#f", "p%3Fx%3D1%23f"), (".", "%2E"),
    ("..", "%2E%2E"), ("é", "%C3%A9"),
])
def test_ids_travel_as_one_encoded_path_segment(item_id: str, raw: str) -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.raw_path.decode())
        return httpx.Response(200, json=item_json(item_id)) if request.method == "GET" and "image" not in str(
            request.url) else httpx.Response(200, content=b"x")

    client = _client(handler)
    client.get_item(item_id)
    client.get_image(item_id)
    client.delete(item_id)
    assert seen == [f"/pool/{raw}", f"/pool/{raw}/image", f"/pool/{raw}"]


def test_an_empty_id_is_unknown_without_a_request() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"no request expected, got {request.url}")

    for call in (_client(handler).get_item, _client(handler).get_image, _client(handler).delete):
        with pytest.raises(RetrieverNotFoundError, match="no pool item ''"):
            call("")


def test_provider_labels_come_from_the_search_answers_without_item_reads() -> None:
    """Issue 33: a neighbour's label travels with the search answer; only an id no search returned costs a
    metadata read."""
    gets: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/search":
            return httpx.Response(200, json={"identity": "r", "k": 2, "results": [
                {"ids": ["t-1", "t-2"], "scores": [0.9, 0.8], "labels": ["dog", None]},
                {"ids": ["t-3"], "scores": [0.7], "labels": ["cat"]}]})
        gets.append(request.url.path)
        return httpx.Response(200, json=item_json("t-9", label="fox"))

    provider = RetrieverProvider(_client(handler))
    provider.search(np.ones((2, 4), np.float32), 2)
    assert provider.labels(["t-3", "t-1", "t-2"]) == ["cat", "dog", None] and gets == []
    assert provider.labels(["t-9", "t-1"]) == ["fox", "dog"] and gets == ["/pool/t-9"]


def test_search_without_labels_reads_as_unlabelled() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"identity": "r", "k": 2, "results": [{"ids": ["t-1"], "scores": [0.9]}]})

    res = _client(handler).search(np.ones((1, 4), np.float32), 2)
    assert res.labels == [[None]]

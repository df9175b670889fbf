"""Every retrieval option of issue 52 against the real retriever app in-process (vectors-only pool): the ranking
each gives through the service, and the deletion guarantee: once an item is withdrawn, no option returns it."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from PIL import Image
from retriever_kit import unit_vectors, vector_retriever
from tiny_models import tiny_problem

from t3ar.clients.retriever import RetrieverClient, RetrieverProvider
from t3ar.method.ranking import class_conditional_rank
from t3ar.retrieval_ranking import RANKINGS, BaseView, ranked_search

DIM = 8
CLASSES = ("a", "b", "c")


class ImagesFromIds(RetrieverProvider):
    """The real service's searches and labels; images made from the id (a vectors-only pool stores none)."""

    def fetch(self, ids: Sequence[str]) -> list[Image.Image]:
        out = []
        for pid in ids:
            seed = int.from_bytes(hashlib.sha256(pid.encode()).digest()[:4], "little")
            out.append(Image.fromarray(np.random.default_rng(seed).integers(0, 256, (16, 16, 3), dtype=np.uint8)))
        return out


@pytest.fixture()
def pool(tmp_path: Path) -> Iterator[tuple[ImagesFromIds, np.ndarray, list[str], list[str | None]]]:
    """40 items: 10 of each class and 10 unlabelled; yields (provider, vectors, ids, labels)."""
    vecs = unit_vectors(40, DIM, seed=3)
    with vector_retriever(tmp_path / "pool", DIM) as app:
        def forward(request: httpx.Request) -> httpx.Response:  # the retriever client's calls, to the app
            got = app.request(request.method, str(request.url.copy_with(scheme=None, host=None)).lstrip("/") or "/",
                              headers=dict(request.headers), content=request.read())
            return httpx.Response(got.status_code, headers=got.headers, content=got.content)

        client = RetrieverClient("http://retriever", "admin-t", transport=httpx.MockTransport(forward), retries=0)
        ids: list[str] = []
        labels: list[str | None] = []
        for j, label in enumerate([*CLASSES, None]):
            ids += client.add_vectors(vecs[10 * j:10 * j + 10], identity="synthetic", label=label)
            labels += [label] * 10
        yield ImagesFromIds(client), vecs, ids, labels
        client.close()


def _search(provider: ImagesFromIds, queries: np.ndarray, m: int, ranking: str, pseudo: torch.Tensor
            ) -> tuple[np.ndarray, list[list[str]]]:
    model, target, _, _ = tiny_problem(n_target=len(queries), seed=2)
    view = BaseView(model, target, mean=(0.5,) * 3, std=(0.5,) * 3, device=torch.device("cpu"), train_groups=None)
    return ranked_search(provider, queries, m, ranking, view=view, target=target, classes=CLASSES, pseudo=pseudo,
                         confident=torch.ones(len(queries), dtype=torch.bool), image_size=16)


def test_class_conditional_through_the_service_is_the_exact_ranking(
        pool: tuple[ImagesFromIds, np.ndarray, list[str], list[str | None]]) -> None:
    provider, vecs, ids, labels = pool
    queries = unit_vectors(4, DIM, seed=9)
    pseudo = torch.tensor([0, 1, 2, 1])
    confident = torch.tensor([True, True, False, True])
    _, got = ranked_search(provider, queries, 12, "class-conditional", classes=CLASSES, pseudo=pseudo,
                           confident=confident)
    classes = torch.tensor([CLASSES.index(lab) if lab else -1 for lab in labels])
    want = class_conditional_rank(torch.from_numpy(queries @ vecs.T), classes, pseudo, confident, 12)
    assert got == [[ids[j] for j in row] for row in want.tolist()]
    assert all(labels[ids.index(p)] == "a" for p in got[0][:10]) and labels[ids.index(got[0][10])] != "a"


def test_base_rerank_reorders_the_services_candidates_only(
        pool: tuple[ImagesFromIds, np.ndarray, list[str], list[str | None]]) -> None:
    provider, _, _, _ = pool
    queries = unit_vectors(3, DIM, seed=4)
    _, plain = provider.search(queries, 8)
    scores, got = _search(provider, queries, 8, "base-rerank", torch.zeros(3, dtype=torch.long))
    assert [sorted(r) for r in got] == [sorted(r) for r in plain]
    assert got != plain  # the tiny model's features order them otherwise than R
    r_scores, r_ids = provider.search(queries, 8)
    for i, row in enumerate(got):  # each candidate keeps its R score (what the near-duplicate threshold reads)
        score_of = dict(zip(r_ids[i], r_scores[i].tolist(), strict=True))
        assert scores[i].tolist() == pytest.approx([score_of[p] for p in row])


@pytest.mark.parametrize("ranking", RANKINGS)
def test_a_withdrawn_item_never_comes_back_through_any_option(
        pool: tuple[ImagesFromIds, np.ndarray, list[str], list[str | None]], ranking: str) -> None:
    provider, vecs, ids, labels = pool
    queries = vecs[[0, 12, 25]] + 0.01  # each query's nearest item is one of the pool's labelled items
    pseudo = torch.tensor([0, 1, 2])  # ... and carries the query's pseudo-label
    _, before = _search(provider, queries, 10, ranking, pseudo)
    withdrawn = {ids[0], ids[12], ids[25]}
    assert all(ids[q] in row for q, row in zip((0, 12, 25), before, strict=True))  # found before
    provider.client.delete_many(sorted(withdrawn))
    _, after = _search(provider, queries, 10, ranking, pseudo)
    assert not withdrawn & {p for row in after for p in row}
    assert all(p for row in after for p in row)  # the others fill the slots


def test_a_label_filtered_search_answers_only_that_labels_items(
        pool: tuple[ImagesFromIds, np.ndarray, list[str], list[str | None]]) -> None:
    provider, _, ids, labels = pool
    queries = unit_vectors(2, DIM, seed=5)
    _, got = provider.search_label(queries, 15, "b")
    assert all(labels[ids.index(p)] == "b" for row in got for p in row[:10]) and got[0][10:] == [""] * 5
    _, none = provider.search_label(queries, 3, "no-such-label")
    assert none == [["", "", ""]] * 2

"""Ranking options (issue 52, item 2): each ranking pinned on small tensors."""

from __future__ import annotations

import pytest
import torch

from t3ar.method.ranking import (
    candidate_count,
    class_conditional_rank,
    confident_pseudo_labels,
    merge_class_conditional,
    rerank_by_features,
)


def test_rerank_orders_each_rows_candidates_by_feature_cosine() -> None:
    pool = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.0]])
    queries = torch.tensor([[0.0, 2.0], [3.0, 0.1]])
    cand = torch.tensor([[0, 2, 1, -1], [3, 1, 2, 0]])
    assert rerank_by_features(queries, pool, cand).tolist() == [[1, 2, 0, -1], [0, 2, 1, 3]]


def test_rerank_keeps_the_index_order_on_ties_and_never_adds_an_item() -> None:
    pool = torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0]])  # 0 and 1 tie (same direction)
    out = rerank_by_features(torch.tensor([[1.0, 0.0]]), pool, torch.tensor([[2, 1, -1, 0]]))
    assert out.tolist() == [[1, 0, 2, -1]]
    assert sorted(out[0].tolist()) == sorted([2, 1, -1, 0])


def test_confident_pseudo_labels() -> None:
    logits = torch.tensor([[4.0, 0.0, 0.0], [0.0, 0.1, 0.0], [0.0, 0.0, 9.0]])
    pseudo, confident = confident_pseudo_labels(logits, 0.5)
    assert pseudo.tolist() == [0, 1, 2] and confident.tolist() == [True, False, True]


def test_merge_class_conditional_fills_from_plain_and_leaves_unconfident_rows() -> None:
    conditional = torch.tensor([[7, 8, -1, -1], [1, 2, 3, 4]])
    plain = torch.tensor([[8, 5, 6, 9], [9, 9, 9, 9]])
    out = merge_class_conditional(conditional, plain, torch.tensor([True, False]))
    assert out.tolist() == [[7, 8, 5, 6], [9, 9, 9, 9]]


def test_class_conditional_rank_puts_the_pseudo_labels_class_first() -> None:
    scores = torch.tensor([[0.9, 0.8, 0.7, 0.6, 0.5],
                           [0.9, 0.8, 0.7, 0.6, 0.5]])
    classes = torch.tensor([0, 1, -1, 1, 0])
    pseudo, confident = torch.tensor([1, 1]), torch.tensor([True, False])
    out = class_conditional_rank(scores, classes, pseudo, confident, 4)
    assert out.tolist() == [[1, 3, 0, 2], [0, 1, 2, 3]]
    assert class_conditional_rank(scores[:, :2], classes[:2], pseudo, confident, 3).tolist() == [[1, 0, -1],
                                                                                                 [0, 1, -1]]


@pytest.mark.parametrize(("pool", "expected"), [(10, 25), (10_000, 25), (10_001, 50), (100_000, 50),
                                                (100_001, 100), (2_000_000, 200), (10**9, 256)])
def test_candidate_count_doubles_per_decade_past_ten_thousand(pool: int, expected: int) -> None:
    assert candidate_count(5, 5, pool, cap=256) == expected


def test_candidate_count_never_below_k() -> None:
    assert candidate_count(8, 1, 10, cap=4) == 8

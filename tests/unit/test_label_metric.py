"""The retriever adapted to the pool's labels (issue 52, item 2): the regularised LDA map, the ranking in its space
(which only re-orders the candidates it is given: a withdrawn item never comes back), the labelled neighbours'
vote and the refined pseudo-labels."""

from __future__ import annotations

import pytest
import torch

from t3ar.label_metric import adapted_rerank, fit_label_metric, neighbour_vote, refine_pseudo_labels

# pool: the style (x or y) varies inside each class, the class is the small z component's sign; item 4 unlabelled
POOL = torch.tensor([[1.0, 0.0, 0.1], [0.0, 1.0, 0.1], [1.0, 0.0, -0.1], [0.0, 1.0, -0.1], [1.0, 0.0, -0.1]])
CLASSES = torch.tensor([0, 0, 1, 1, -1])
QUERY = torch.tensor([[1.0, 0.0, 0.02]])  # class 0, drawn in the x style: R's nearest are x-style items


def test_the_map_puts_same_class_items_near_where_raw_cosine_does_not() -> None:
    metric = fit_label_metric(POOL, CLASSES, shrinkage=0.1)
    assert metric.projection.shape == (3, 1) and metric.classes == 2  # C - 1 directions
    mapped = metric.transform(POOL)
    assert (mapped[:2, 0] > 0).all() and (mapped[2:, 0] < 0).all()  # the unlabelled item maps like its twin
    raw = torch.nn.functional.normalize(QUERY, dim=1) @ torch.nn.functional.normalize(POOL[:4], dim=1).T
    assert int(raw.argsort(descending=True)[0, 1]) == 2  # R: the x-style item of the other class comes second
    assert float(metric.transform(QUERY)[0, 0]) > 0


def test_adapted_rerank_pins_the_order_and_keeps_the_candidate_set() -> None:
    metric = fit_label_metric(POOL, CLASSES, shrinkage=0.1)
    candidates = torch.tensor([[2, 0, 3, 1, -1]])  # the index's order (R); -1 missing
    got = adapted_rerank(metric, QUERY, POOL, candidates)
    # one direction: cosine is +1 for class 0, -1 for class 1; ties keep the index's order; missing stays last
    assert got.tolist() == [[0, 1, 2, 3, -1]]
    assert sorted(got[0].tolist()) == sorted(candidates[0].tolist())


def test_a_withdrawn_item_absent_from_the_candidates_never_comes_back() -> None:
    metric = fit_label_metric(POOL, CLASSES, shrinkage=0.1)
    # item 0 is the query's nearest in the mapped space, but it was withdrawn: the index did not return it
    candidates = torch.tensor([[2, 3, 1], [3, 2, -1]])
    got = adapted_rerank(metric, QUERY.repeat(2, 1), POOL, candidates)
    assert 0 not in got.tolist()[0] and 0 not in got.tolist()[1]
    assert got.tolist() == [[1, 2, 3], [3, 2, -1]]
    vote = neighbour_vote(got, CLASSES, n_classes=2, k=5)
    assert torch.allclose(vote, torch.tensor([[1 / 3, 2 / 3], [0.0, 1.0]]))  # only the candidates vote


def test_fit_ignores_unlabelled_items_and_rejects_what_it_cannot_fit() -> None:
    a = fit_label_metric(POOL, CLASSES, shrinkage=0.3)
    b = fit_label_metric(POOL[:4], CLASSES[:4], shrinkage=0.3)
    assert torch.allclose(a.projection, b.projection) and torch.allclose(a.center, b.center)
    with pytest.raises(ValueError, match="at least two"):
        fit_label_metric(POOL, torch.tensor([0, 0, -1, -1, -1]))
    with pytest.raises(ValueError, match="shrinkage"):
        fit_label_metric(POOL, CLASSES, shrinkage=0.0)
    with pytest.raises(ValueError, match="dimension"):
        a.transform(torch.ones(1, 4))


def test_three_classes_give_two_directions_and_the_fit_is_deterministic() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(30, 6, generator=gen)
    y = torch.arange(30) % 3
    m1, m2 = fit_label_metric(x, y), fit_label_metric(x, y)
    assert m1.projection.shape == (6, 2)
    assert torch.equal(m1.projection, m2.projection)
    assert fit_label_metric(x, y, dims=4).projection.shape == (6, 4)


def test_neighbour_vote_counts_the_first_k_labelled_candidates() -> None:
    pool_classes = torch.tensor([0, 1, -1, 1, 2])
    vote = neighbour_vote(torch.tensor([[2, 0, 1, 3, 4], [-1, -1, -1, -1, -1]]), pool_classes, n_classes=3, k=2)
    assert vote.tolist() == [[0.5, 0.5, 0.0], [0.0, 0.0, 0.0]]  # the unlabelled item 2 is skipped, not counted


def test_refined_pseudo_labels_mix_the_model_and_the_vote() -> None:
    logits = torch.tensor([[2.0, 0.0], [0.0, 0.1]])
    vote = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    assert refine_pseudo_labels(logits, vote, 0.0, 0.0)[0].tolist() == [0, 1]  # the model's own
    assert refine_pseudo_labels(logits, vote, 1.0, 0.0)[0].tolist() == [1, 0]  # the vote's
    pseudo, confident = refine_pseudo_labels(logits, vote, 0.5, 0.7)
    # row 0: 0.5 * 0.881 vs 0.5 * 0.119 + 0.5 -> class 1 (0.56); row 1: class 0 (0.5 * 0.475 + 0.5 = 0.74)
    assert pseudo.tolist() == [1, 0] and confident.tolist() == [False, True]
    with pytest.raises(ValueError, match="weight"):
        refine_pseudo_labels(logits, vote, 1.5, 0.0)

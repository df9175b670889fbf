"""Neighbour quality (issue 52, item 1): the pure measures pinned on small tensors."""

from __future__ import annotations

import pytest
import torch

from t3ar.method.neighbour_quality import Agreement, NeighbourQuality, hit_rate, label_agreement, source_mix


def test_label_agreement_counts_only_labelled_neighbours_of_known_queries() -> None:
    neighbours = torch.tensor([[0, 0, 1, -1],    # ref 0: 2 of 3 labelled match
                               [2, -1, -1, -1],  # ref 1: 0 of 1
                               [1, 1, 1, 1],     # ref unknown: left out
                               [-1, -1, -1, -1]])  # ref 3: nothing labelled
    ref = torch.tensor([0, 1, -1, 3])
    a = label_agreement(neighbours, ref)
    assert a == Agreement(matches=2, labelled=4, queries=3)
    assert a.share == pytest.approx(0.5)


def test_no_labelled_neighbour_gives_no_share() -> None:
    a = label_agreement(torch.full((2, 3), -1), torch.tensor([0, 1]))
    assert a.labelled == 0 and a.share is None


def test_hit_rate_is_the_share_of_queries_with_one_neighbour_of_their_class() -> None:
    neighbours = torch.tensor([[5, 0, -1], [2, 2, 2], [-1, -1, 1], [0, 0, 0]])
    assert hit_rate(neighbours, torch.tensor([0, 1, 1, -1])) == pytest.approx(2 / 3)
    assert hit_rate(neighbours, torch.tensor([-1, -1, -1, -1])) is None


def test_shapes_are_checked() -> None:
    with pytest.raises(ValueError, match=r"\[N, k\]"):
        label_agreement(torch.zeros(3, 2, dtype=torch.long), torch.zeros(2, dtype=torch.long))


def test_source_mix_counts_drawn_neighbours_most_first() -> None:
    assert source_mix([["emoji", "icons", ""], ["icons", "icons", "tux"]]) == {"icons": 3, "emoji": 1, "tux": 1}
    assert list(source_mix([["b", "a"]])) == ["a", "b"]  # equal counts: by name


def test_quality_as_dict_is_what_a_report_carries() -> None:
    q = NeighbourQuality("index", 5, 10, pseudo=Agreement(2, 3, 2), truth=Agreement(1, 3, 2), truth_on="holdout",
                         truth_hit_rate=0.5, sources={"a": 10})
    d = q.as_dict()
    assert d["pseudo_label_agreement"] == {"share": 0.6667, "matches": 2, "labelled": 3, "queries": 2}
    assert d["precision_at_k"]["share"] == 0.3333  # type: ignore[index]
    assert d["precision_on"] == "holdout" and d["sources"] == {"a": 10} and d["ranking"] == "index"

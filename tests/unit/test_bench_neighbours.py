"""The neighbour-precision benchmark's pure parts (issue 52): every retriever option's ranking on small tensors,
the precision table and its markdown."""

from __future__ import annotations

import torch

from t3ar.label_metric import fit_label_metric
from t3ar_bench.retrieval.neighbours import (
    ADAPTED,
    RETRIEVERS,
    markdown,
    precision_table,
    rankings,
    summary,
    summary_markdown,
)


def _inputs() -> dict[str, torch.Tensor]:
    # pool: 0 (class 0), 1 (class 1), 2 (unlabelled), 3 (class 1); R and the features disagree on purpose
    r_p = torch.tensor([[1.0, 0.0], [0.9, 0.1], [1.0, 0.0], [0.0, 1.0]])
    bn_p = torch.tensor([[0.0, 1.0], [1.0, 0.0], [1.0, 0.0], [0.7, 0.7]])
    return {"r_q": torch.tensor([[1.0, 0.0]]), "r_p": r_p, "base_q": torch.tensor([[0.0, 1.0]]), "base_p": r_p,
            "bn_q": torch.tensor([[1.0, 0.0]]), "bn_p": bn_p, "pool_classes": torch.tensor([0, 1, -1, 1]),
            "pseudo": torch.tensor([1]), "confident": torch.tensor([True])}


def test_each_option_ranks_only_labelled_items_as_pinned() -> None:
    got = rankings(**_inputs(), k=2, r=1, generator=torch.Generator().manual_seed(0))
    assert set(got) == set(RETRIEVERS) - set(ADAPTED)  # no label map given: the adapted options are left out
    assert got["index"].tolist() == [[0, 1]]  # R: item 2 ties item 0 but is unlabelled
    assert got["base"].tolist() == [[3, 1]]
    assert got["base-bn"].tolist() == [[1, 3]]
    assert got["base-rerank"].tolist() == [[1, 0]]  # R's top 2 (0, 1), re-ordered by the bn features
    assert got["class-conditional"].tolist() == [[1, 3]]  # the pseudo-label's class first, by R
    assert set(got["class-matched-random"].flatten().tolist()) <= {1, 3}
    assert set(got["random"].flatten().tolist()) <= {0, 1, 3}


def test_the_label_adapted_options_use_the_map_fit_on_the_pool_and_the_refined_label() -> None:
    inputs = _inputs()
    metric = fit_label_metric(inputs["r_p"], inputs["pool_classes"], shrinkage=0.5)
    gen = torch.Generator().manual_seed(0)
    got = rankings(**inputs, k=2, r=1, generator=gen, metric=metric, logits=torch.tensor([[0.0, 0.3]]))
    assert list(got) == list(RETRIEVERS)
    # one mapped direction: items 0 and 1 (R's 2 candidates) map alike, so their R order stays; item 3 maps apart
    assert got["label-adapted"].tolist() == [[0, 1]] and got["label-adapted-all"].tolist() == [[0, 1]]
    # the candidates vote half and half: the model's weak class 1 wins, then R's best of the rest
    assert got["refined-class-conditional"].tolist() == [[1, 3]]
    assert got["refined-index-class-conditional"].tolist() == [[1, 3]]  # R's own 2 nearest: the same vote here
    flipped = rankings(**inputs, k=2, r=1, generator=gen, metric=metric, logits=torch.tensor([[0.3, 0.0]]))
    assert flipped["refined-class-conditional"].tolist() == [[0, 1]]  # class 0's one item, then R's others
    no_map = rankings(**inputs, k=2, r=1, generator=gen, logits=torch.tensor([[0.3, 0.0]]))
    assert set(no_map) == set(RETRIEVERS) - set(ADAPTED) | {"refined-index-class-conditional"}


def test_precision_table_and_markdown() -> None:
    ranked = {"index": torch.tensor([[0, 1], [1, -1]]), "base": torch.tensor([[1, 1], [0, 0]])}
    table = precision_table(ranked, torch.tensor([0, 1]), truth=torch.tensor([0, 1]), pseudo=torch.tensor([0, 0]))
    assert table["index"] == {"precision_at_5": 2 / 3, "hit_rate": 1.0, "pseudo_label_accuracy": 0.5}
    assert table["base"]["precision_at_5"] == 0.0 and table["base"]["hit_rate"] == 0.0
    results = {"k": 5, "seeds": [0], "fractions": [0.1],
               "neighbour_precision": {n: {"0.1": {"per_shift": {"twitter": row}}} for n, row in table.items()}}
    text = markdown(results)
    assert "| index | twitter | 66.7 | 50.0 |" in text and "| base | twitter | 0.0 | 50.0 |" in text


def test_summary_gaps_the_goal_and_the_validation_choice() -> None:
    def row(p: float, acc: float) -> dict[str, float]:
        return {"precision_at_5": p, "pseudo_label_accuracy": acc}

    results = {"fractions": [0.1], "neighbour_precision": {
        "index": {"0.1": {"per_shift": {"val": row(0.5, 0.5), "a": row(0.6, 0.5), "b": row(0.4, 0.5),
                                        "c": row(0.7, 0.5)}}},
        "label-adapted": {"0.1": {"per_shift": {"val": row(0.5, 0.5), "a": row(0.5, 0.5), "b": row(0.5, 0.5),
                                                "c": row(0.5, 0.5)}}},
        "refined-class-conditional": {"0.1": {"per_shift": {"val": row(0.45, 0.5), "a": row(0.9, 0.5),
                                                            "b": row(0.9, 0.5), "c": row(0.9, 0.5)}}},
        "class-matched-random": {"0.1": {"per_shift": {"val": row(0.9, 0.5)}}}}}
    summ = summary(results, "val")
    index = summ["goal"]["index"]["0.1"]
    assert index["per_shift"] == {"val": 0.0, "a": 10.0, "b": -10.0, "c": 20.0}
    assert index["median_evaluation"] == 10.0 and index["met"] is True  # the validation shift is not counted
    assert summ["goal"]["label-adapted"]["0.1"]["met"] is False
    # the controls are never chosen; a tie on the validation shift goes to the earlier (simpler) option
    assert summ["validation_choice"]["0.1"]["retriever"] == "index"
    assert "| index | 0.1 | +10.0 | -10.0 | +20.0 | +0.0 | +10.0 | +5.0 | met |" in summary_markdown(summ)

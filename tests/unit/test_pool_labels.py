"""Labelled neighbours as data (issue 33): the draws, the loss term, the BatchNorm options and the second stage,
on tiny tensors."""

import math
from typing import Any

import pytest
import torch
from tiny_models import tiny_problem

from t3ar.method.adapt import AdaptResult, adapt
from t3ar.method.bn_adapt import adapted_norms
from t3ar.method.config import adapt_config
from t3ar.method.pool_labels import LabelDraw, LabelDrawMode, balance_weights, labelled_neighbours
from t3ar.method.probe import PROBE_SWITCHES, Probe
from t3ar.models.classifier import Classifier, iter_batchnorms
from t3ar.pipeline import pool_classes

KNOWN = torch.tensor([0, 1, 2, -1, -1, 0, 1, -1, 2])  # pool items 3, 4 and 7 carry no label


def test_labelled_neighbours_are_the_steps_labelled_distinct_neighbours_capped() -> None:
    g = torch.Generator().manual_seed(0)
    assert labelled_neighbours(torch.tensor([0, 3, 4, 5]), KNOWN, 10, g).tolist() == [0, 5]
    capped = labelled_neighbours(torch.tensor([0, 1, 2, 5, 6]), KNOWN, 2, g)
    assert len(capped) == 2 and set(capped.tolist()) <= {0, 1, 2, 5, 6}


def test_the_random_control_draws_as_many_labelled_items_from_the_whole_pool() -> None:
    draw = LabelDraw("random", KNOWN, 64, torch.Generator().manual_seed(0))
    seen: set[int] = set()
    for _ in range(30):
        rows = draw(torch.tensor([0, 3, 6]))  # two of these neighbours are labelled
        assert len(rows) == 2 and all(KNOWN[r] >= 0 for r in rows)
        seen |= set(rows.tolist())
    assert seen - {0, 6}  # other labelled items than the retrieved ones are drawn
    assert len(draw(torch.tensor([3, 4]))) == 0  # no labelled neighbour: nothing drawn either


def test_the_whole_pool_reference_visits_every_labelled_item_before_repeating() -> None:
    draw = LabelDraw("all", KNOWN, 3, torch.Generator().manual_seed(0))
    first_two = torch.cat([draw(None), draw(torch.tensor([3]))])
    assert sorted(first_two.tolist()) == [0, 1, 2, 5, 6, 8]
    with pytest.raises(ValueError, match="unknown label draw"):
        LabelDraw("nearest", KNOWN, 3, torch.Generator())  # type: ignore[arg-type]


def test_balance_weights_give_each_class_the_same_total() -> None:
    w = balance_weights(torch.tensor([0, 0, 0, 1]))
    assert w.sum().item() == pytest.approx(4.0)
    assert w[:3].sum().item() == pytest.approx(w[3].item())


def test_pool_labels_map_to_model_classes_and_unknown_labels_are_unlabelled() -> None:
    got = pool_classes(["cat", None, "dog", "zebra", ""], ["dog", "cat"])
    assert got.tolist() == [1, -1, 0, -1, -1]


def _data(n_pool: int = 9) -> tuple[Classifier, torch.Tensor, torch.Tensor, torch.Tensor]:
    return tiny_problem(n_pool=n_pool)


def _run(draw: LabelDrawMode = "retrieved", known: torch.Tensor | None = KNOWN, teacher_ema: float = 0.0,
         **over: object) -> tuple[Classifier, AdaptResult]:
    model, target, pool, nbr = _data()
    switches: dict[str, Any] = {k: over.pop(k) for k in PROBE_SWITCHES if k in over}  # the benchmarks'
    fields = {"method": "t3ar", "k": 3, "epochs": 3, "batch_size": 4, "bank_size": 64, "train_groups": None, **over}
    if fields["method"] == "t3ar-noretrieval":  # no pool: no k
        del fields["k"]
    cfg = adapt_config(**fields)
    res = adapt(model, target, cfg, mean=(0.5,) * 3, std=(0.5,) * 3, neighbours=nbr, pool_images=pool,
                device=torch.device("cpu"), pool_labels=known,
                probe=Probe(pool_label_draw=draw, teacher_ema=teacher_ema, **switches))
    return model, res


def _same(a: Classifier, b: Classifier) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_labelled_neighbours_train_with_their_labels_and_are_reported() -> None:
    off, _ = _run(known=None)
    on, res = _run(pool_label_weight=1.0)
    counts = [h.pool_label_count for h in res.history]
    assert all(not math.isnan(c) for c in counts) and sum(counts) > 0
    assert res.pool_labelled and all(KNOWN[i] >= 0 for i in res.pool_labelled)
    assert sum(res.pool_labelled.values()) == sum(counts)
    assert not _same(off, on)


def test_labels_read_but_weight_zero_change_nothing() -> None:
    """Labels alone (weight 0, false negatives kept) add no term: the run is the label-less run."""
    off, _ = _run(known=None)
    zero, res = _run()
    assert _same(off, zero) and res.pool_labelled == {}


def test_the_random_control_serves_as_many_items_per_step() -> None:
    _, ret = _run(pool_label_weight=1.0)
    _, rnd = _run("random", pool_label_weight=1.0)
    assert [h.pool_label_count for h in ret.history] == [h.pool_label_count for h in rnd.history]
    assert ret.pool_labelled != rnd.pool_labelled


def test_a_label_draw_other_than_retrieved_needs_labels_and_a_weight() -> None:
    with pytest.raises(ValueError, match="pool_label_draw"):
        _run("random")


def test_labelled_false_negatives_are_masked_by_their_label() -> None:
    """With false negatives masked, a pool label changes which pool entries are negatives (no data term)."""
    masked, _ = _run(known=None, false_negatives="mask", pool_negatives="all")
    by_label, _ = _run(false_negatives="mask", pool_negatives="all")
    assert not _same(masked, by_label)


def test_bn_start_sets_the_targets_statistics_and_bn_fixed_keeps_them() -> None:
    model, target, _, _ = _data()
    cfg = adapt_config(method="t3ar-noretrieval", epochs=2, batch_size=4, bank_size=64, train_groups=1,
                      lr=1e-3)
    fixed = Probe(bn_start=True, bn_fixed=True)  # the benchmarks' switches, out of the product
    ref, *_ = _data()
    bn = adapt_config(method="bn-adapt", batch_size=4, train_groups=1, seed=0)
    adapt(ref, target, bn, mean=(0.5,) * 3, std=(0.5,) * 3, device=torch.device("cpu"),
          generator=torch.Generator().manual_seed(0 * 1_000_003 + 9))
    adapt(model, target, cfg, mean=(0.5,) * 3, std=(0.5,) * 3, device=torch.device("cpu"), probe=fixed)
    # the adapted layers hold bn-adapt's statistics (the same batches), untouched by the steps
    for a, b in zip(adapted_norms(model, 1), adapted_norms(ref, 1), strict=True):
        assert torch.allclose(a.running_mean, b.running_mean) and torch.allclose(a.running_var, b.running_var)
    moving, *_ = _data()
    adapt(moving, target, cfg, mean=(0.5,) * 3, std=(0.5,) * 3, device=torch.device("cpu"),
          probe=Probe(bn_start=True))
    assert any(not torch.allclose(a.running_mean, b.running_mean)
               for a, b in zip(iter_batchnorms(moving), iter_batchnorms(ref), strict=True))


def test_the_second_stage_trains_only_the_bottleneck_and_head() -> None:
    first, res1 = _run(method="t3ar-noretrieval", known=None)
    both, res2 = _run(method="t3ar-noretrieval", known=None, second_stage_steps=5, second_stage_lr=0.01)
    assert res1.second_stage_steps == 0 and res2.second_stage_steps == 5 and res2.steps == res1.steps
    for name, a in first.state_dict().items():
        b = both.state_dict()[name]
        if name.startswith("backbone."):
            assert torch.equal(a, b), name  # frozen, BatchNorm statistics included
    head_changed = [not torch.equal(first.state_dict()[n], both.state_dict()[n])
                    for n in first.state_dict() if n.startswith(("head.", "bottleneck.0."))]
    assert any(head_changed)
    # BatchNorm of the bottleneck normalises with its running statistics in the second stage: they stay
    assert torch.equal(first.state_dict()["bottleneck.1.running_mean"], both.state_dict()["bottleneck.1.running_mean"])


def test_family_only_options_are_refused_elsewhere() -> None:
    with pytest.raises(ValueError, match="T3AR family"):
        adapt_config(method="adacontrast", second_stage_steps=3)
    for method in ("t3ar", "adacontrast"):  # out of the product: the refusal says where it went
        with pytest.raises(ValueError, match=f"bn_fixed is not an option of {method}: no benchmark round kept it"):
            adapt_config(method=method, bn_fixed=True)
    with pytest.raises(ValueError, match="batchnorm"):
        adapt_config(method="t3ar", batchnorm={"start": True})


def test_an_ema_teacher_computes_the_keys_and_stays_out_of_the_optimiser() -> None:
    plain, _ = _run(known=None)
    taught, res = _run(known=None, teacher_ema=0.9)
    assert not _same(plain, taught) and all(math.isfinite(h.loss) for h in res.history)
    # with momentum ~0 the teacher is the current model at every step: the same first step as without one (up to
    # the float rounding of the training loop's folded frozen layers, which the teacher copy does not fold)
    _, res_plain = _run(known=None)
    _, res_zero = _run(known=None, teacher_ema=1e-12)
    assert res_zero.history[0].loss == pytest.approx(res_plain.history[0].loss, rel=1e-3)

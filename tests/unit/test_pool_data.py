"""Retrieved neighbours as data and the false negatives among them, on tiny tensors."""

import math
from typing import Any

import pytest
import torch
from tiny_models import tiny_problem

from t3ar.method import losses
from t3ar.method.adapt import adapt
from t3ar.method.bank import MemoryBank
from t3ar.method.config import adapt_config
from t3ar.method.pool_data import agreement, same_class_pool_entries, select_pool_data
from t3ar.method.probe import PROBE_SWITCHES, Probe
from t3ar.models.classifier import Classifier


def _logits(rows: list[tuple[int, float]], classes: int = 3) -> torch.Tensor:
    """Mean logits whose softmax has its maximum ``conf`` at ``cls`` (the rest spread evenly)."""
    out = torch.empty(len(rows), classes)
    for i, (cls, conf) in enumerate(rows):
        p = torch.full((classes,), (1 - conf) / (classes - 1))
        p[cls] = conf
        out[i] = p.log()
    return out


def test_agreement_needs_a_query_that_retrieved_it_with_the_same_label() -> None:
    nbr = torch.tensor([[10, 11], [12, -1]])  # query 0 retrieved 10 and 11, query 1 retrieved 12
    y = torch.tensor([0, 1])
    local = torch.tensor([10, 11, 12, 13])
    pl = torch.tensor([0, 1, 1, 0])  # 10 agrees with query 0; 11 is class 1 but query 0 is 0; 12 agrees; 13 unretrieved
    assert agreement(nbr, y, local, pl).tolist() == [True, False, True, False]
    assert agreement(nbr, y, local, torch.tensor([-1, -1, -1, -1])).tolist() == [False] * 4


def test_selection_threshold_cap_sources_and_unseen() -> None:
    nbr = torch.tensor([[0, 1, 2], [3, 4, -1]])
    y = torch.tensor([2, 0])
    local = torch.tensor([0, 1, 2, 3, 4])
    mean = _logits([(2, 0.9), (2, 0.4), (2, 0.7), (0, 0.95), (0, 0.8)])
    counts = torch.tensor([3, 3, 3, 3, 0])  # item 4 has no stored view yet
    got = select_pool_data(nbr, y, local, mean, counts, threshold=0.5, cap=10)
    assert got.rows.tolist() == [0, 2, 3] and got.labels.tolist() == [2, 2, 0]  # 1: unconfident; 4: unseen
    capped = select_pool_data(nbr, y, local, mean, counts, threshold=0.5, cap=2)
    assert capped.rows.tolist() == [0, 3]  # the two most confident, in position order
    allowed = torch.tensor([False, True, True, True, True])
    assert select_pool_data(nbr, y, local, mean, counts, threshold=0.5, cap=10, allowed=allowed).rows.tolist() == [2, 3]
    assert len(select_pool_data(nbr, y, local, mean, counts, threshold=0.99, cap=10).rows) == 0


def test_false_negatives_are_pool_entries_in_the_querys_class() -> None:
    from_pool = torch.tensor([False, True, True, True])
    pool_labels = torch.tensor([-1, 0, 1, -1])
    fn = same_class_pool_entries(from_pool, pool_labels, torch.tensor([0, 1, 2]))
    assert fn.tolist() == [[False, True, False, False], [False, False, True, False], [False] * 4]


def test_the_multi_positive_infonce_reduces_to_the_plain_one_and_rewards_extra_positives() -> None:
    g = torch.Generator().manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(4, 8, generator=g), dim=1)
    k = torch.nn.functional.normalize(torch.randn(4, 8, generator=g), dim=1)
    bank = torch.nn.functional.normalize(torch.randn(6, 8, generator=g), dim=1)
    neg = torch.ones(4, 6, dtype=torch.bool)
    logits = losses.info_nce_logits(q, k, bank, neg, 0.5)
    none = torch.zeros(4, 6, dtype=torch.bool)
    assert torch.allclose(losses.info_nce_multi(logits, none), losses.info_nce_from_logits(logits))
    extra = none.clone()
    extra[:, 0] = True  # bank entry 0 becomes a positive of every query: the loss can only fall
    assert losses.info_nce_multi(logits, extra) < losses.info_nce_from_logits(logits)


def test_neighbour_entries_are_the_querys_own_pool_entries() -> None:
    bank = MemoryBank(4, 2, 3)
    bank.enqueue(torch.zeros(2, 2), torch.tensor([7, 8]), from_pool=True)
    bank.enqueue(torch.zeros(1, 2), torch.tensor([7]))  # a target entry with the same number: another id space
    got = losses.neighbour_entries(bank, torch.tensor([[7, -1], [8, 7]]))
    assert got.tolist() == [[True, False, False, False], [True, True, False, False]]


def _run(device: torch.device | None = None, **options: object) -> tuple[Classifier, object]:
    device = device or torch.device("cpu")
    model, target, pool, nbr = tiny_problem(device=device)
    switches: dict[str, Any] = {k: options.pop(k) for k in PROBE_SWITCHES if k in options}  # the benchmarks'
    cfg = adapt_config(method="t3ar", k=3, epochs=3, batch_size=4, bank_size=64, train_groups=None, **options)  # type: ignore[arg-type]
    res = adapt(model, target, cfg, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), neighbours=nbr, pool_images=pool,
                device=device, pool_sources=["emoji"] * 5 + ["clipart"] * 4,
                probe=Probe(pool_diagnostic_labels=torch.tensor([0, 1, 2, 0, 1, -1, -1, -1, -1]), **switches))
    return model, res


def test_neighbours_as_data_train_the_model_and_report_what_served() -> None:
    off, _ = _run()
    on, res = _run(pool_data_weight=1.0, pool_data_threshold=0.0)
    assert any(not torch.equal(a, b) for a, b in zip(off.state_dict().values(), on.state_dict().values(), strict=True))
    served = [h.pool_data_count for h in res.history]  # type: ignore[attr-defined]
    assert all(not math.isnan(c) for c in served) and sum(served) > 0
    known = [h.pool_data_known for h in res.history if h.pool_data_count > 0]  # type: ignore[attr-defined]
    assert all(0 <= k <= c for k, c in zip(known, served, strict=False))


def test_neighbours_as_data_that_none_pass_change_nothing() -> None:
    """A threshold nothing passes (no softmax reaches 1 here) trains exactly what the option off trains: the
    option adds one loss term and nothing else to the step."""
    off, _ = _run()
    none, res = _run(pool_data_weight=1.0, pool_data_threshold=1.0)
    assert all(h.pool_data_count == 0 for h in res.history)  # type: ignore[attr-defined]
    assert all(torch.equal(a, b) for a, b in zip(off.state_dict().values(), none.state_dict().values(), strict=True))


def test_only_allowed_sources_serve() -> None:
    _, res = _run(pool_data_weight=1.0, pool_data_threshold=0.0, pool_data_sources=("clipart",))
    # every item that served came from 'clipart', whose labels are unknown: nothing known ever served
    assert sum(h.pool_data_count for h in res.history) > 0  # type: ignore[attr-defined]
    assert all(h.pool_data_known in (0, 0.0) or math.isnan(h.pool_data_known) for h in res.history)  # type: ignore[attr-defined]


@pytest.mark.parametrize("mode", ["mask", "positive"])
def test_false_negative_control_changes_the_contrastive_term(mode: str) -> None:
    keep, rk = _run(pool_negatives="all")
    ctrl, rc = _run(pool_negatives="all", false_negatives=mode)
    assert [h.loss_ce for h in rk.history][:1] == pytest.approx([h.loss_ce for h in rc.history][:1])  # type: ignore[attr-defined]
    assert any(not torch.equal(a, b) for a, b in zip(keep.state_dict().values(), ctrl.state_dict().values(),
                                                     strict=True))


def test_the_oracle_serves_known_neighbours_with_their_true_labels() -> None:
    _, res = _run(pool_data_weight=1.0, pool_data_threshold=0.99)
    model, target, pool, nbr = tiny_problem()
    cfg = adapt_config(method="t3ar", k=3, epochs=3, batch_size=4, bank_size=64, train_groups=None,
                      pool_data_weight=1.0, pool_data_threshold=0.99)
    oracle = adapt(model, target, cfg, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), neighbours=nbr, pool_images=pool,
                   device=torch.device("cpu"),
                   probe=Probe(pool_diagnostic_labels=torch.tensor([0, 1, 2, 0, 1, -1, -1, -1, -1]),
                               pool_label_oracle=True))
    correct = [h.pool_data_correct for h in oracle.history if h.pool_data_known > 0]
    assert correct and all(c == 1.0 for c in correct)


def test_sources_restrict_data_only_when_known() -> None:
    model, target, pool, nbr = tiny_problem(8, 4, 2)
    cfg = adapt_config(method="t3ar", k=2, epochs=1, batch_size=4, pool_data_weight=1.0, pool_data_sources=("a",))
    with pytest.raises(ValueError, match="pool_sources"):
        adapt(model, target, cfg, mean=(0.5,) * 3, std=(0.5,) * 3, neighbours=nbr, pool_images=pool,
              device=torch.device("cpu"))


def test_a_local_pools_sources_are_its_top_folders() -> None:
    from t3ar.local_pool import LocalPool

    assert LocalPool.sources(object.__new__(LocalPool), ["clipart/a.png", "emoji/x/b.png", "c.png"]) == \
        ["clipart", "emoji", ""]


@pytest.mark.gpu
@pytest.mark.parametrize("false_negatives", ["keep", "mask", "positive"])
def test_on_cuda_with_amp_neighbours_as_data_and_false_negative_control(false_negatives: str) -> None:
    from t3ar.device import resolve_device

    dev = resolve_device("auto")  # CUDA: the gpu mark skips this test without it
    model, res = _run(dev, amp=True, pool_data_weight=1.0, pool_data_threshold=0.0, pool_negatives="all",
                      false_negatives=false_negatives)
    assert next(model.parameters()).device.type == "cuda"
    assert all(math.isfinite(h.loss) for h in res.history)  # type: ignore[attr-defined]
    assert sum(h.pool_data_count for h in res.history) > 0  # type: ignore[attr-defined]

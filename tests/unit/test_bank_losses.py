"""The method's pieces on tiny hand-made tensors."""

import math

import pytest
import torch
import torch.nn.functional as F

from t3ar.method import losses
from t3ar.method.bank import MemoryBank
from t3ar.method.retrieval import dedup_sample, random_neighbours
from t3ar.method.schedule import epoch_batches, lr_lambda, steps_per_epoch


def test_bank_fifo_order_and_wraparound() -> None:
    bank = MemoryBank(size=4, feat_dim=2, num_classes=3)
    bank.enqueue(torch.ones(3, 2), torch.tensor([10, 11, 12]), logits=torch.zeros(3, 3))
    assert bank.ptr == 3 and len(bank) == 3
    assert bank.ids.tolist() == [10, 11, 12, -1]
    bank.enqueue(torch.ones(2, 2) * 2, torch.tensor([20, 21]), from_pool=True)
    # oldest entry (slot 0, id 10) is overwritten first
    assert bank.ids.tolist() == [21, 11, 12, 20]
    assert bank.from_pool.tolist() == [True, False, False, True]
    assert bank.ptr == 1 and len(bank) == 4
    assert torch.equal(bank.logits[0], torch.zeros(3))  # pool entries carry no logits


def test_bank_larger_batch_than_bank_keeps_newest() -> None:
    bank = MemoryBank(size=2, feat_dim=1, num_classes=2)
    bank.enqueue(torch.arange(5.0)[:, None], torch.arange(5))
    assert sorted(bank.ids.tolist()) == [3, 4]


def test_mean_logits_averages_only_target_entries_of_that_id() -> None:
    bank = MemoryBank(size=8, feat_dim=2, num_classes=2)
    bank.enqueue(torch.zeros(3, 2), torch.tensor([0, 1, 0]),
                 logits=torch.tensor([[2.0, 0.0], [0.0, 1.0], [0.0, 4.0]]))
    bank.enqueue(torch.zeros(1, 2), torch.tensor([0]), from_pool=True)  # pool id 0 must not count
    mean, counts = bank.mean_logits(torch.tensor([0, 1, 5]))
    assert counts.tolist() == [2, 1, 0]
    assert torch.allclose(mean[0], torch.tensor([1.0, 2.0]))
    assert mean[0].argmax() == 1  # filtered pseudo-label differs from the first view's argmax (0)
    assert torch.allclose(mean[2], torch.zeros(2))


def test_live_is_the_written_prefix_and_gives_the_whole_banks_losses() -> None:
    torch.manual_seed(0)
    bank = MemoryBank(size=64, feat_dim=4, num_classes=3)
    assert bank.live().feats.shape == (0, 4)
    bank.enqueue(F.normalize(torch.randn(10, 4), dim=1), torch.arange(10), logits=torch.randn(10, 3))
    bank.enqueue(F.normalize(torch.randn(5, 4), dim=1), torch.tensor([3, 4, 5, 6, 7]), from_pool=True)
    live = bank.live()
    assert live.filled == 15 and live.feats.shape == (15, 4) and live.feats.data_ptr() == bank.feats.data_ptr()
    ids, labels = torch.tensor([1, 2]), torch.tensor([0, 2])
    q, k = F.normalize(torch.randn(2, 4), dim=1), F.normalize(torch.randn(2, 4), dim=1)
    nbr = torch.tensor([[3, 5], [6, -1]])
    results = []
    for b in (bank, live):
        bank_labels = torch.where(b.valid & ~b.from_pool, b.ids % 3, -1)
        mask = losses.negative_mask(b, ids, labels, bank_labels, nbr)
        logits = losses.info_nce_logits(q, k, b.feats, mask, 0.1)
        results.append((losses.info_nce_from_logits(logits), losses.denominator_share(logits, mask & b.from_pool),
                        b.mean_logits(ids)[0]))
    for whole, prefix in zip(*results, strict=True):
        assert torch.allclose(whole, prefix, atol=1e-6)
    bank.enqueue(torch.zeros(60, 4), torch.arange(60))  # wraps: every slot written
    assert bank.live().filled == 64 and len(bank.live().ids) == 64


def _bank_for_mask() -> MemoryBank:
    bank = MemoryBank(size=8, feat_dim=2, num_classes=2)
    # target entries: ids 0,1,2 ; pool entries: ids 7, 8
    bank.enqueue(torch.zeros(3, 2), torch.tensor([0, 1, 2]), logits=torch.zeros(3, 2))
    bank.enqueue(torch.zeros(2, 2), torch.tensor([7, 8]), from_pool=True)
    return bank


def test_negative_mask_rules() -> None:
    bank = _bank_for_mask()
    bank_labels = torch.tensor([0, 1, 0, -1, -1, -1, -1, -1])
    # query id 0 with label 0; query id 1 with label 1
    mask = losses.negative_mask(bank, torch.tensor([0, 1]), torch.tensor([0, 1]), bank_labels,
                                torch.tensor([[8], [7]]))
    # query 0: id 1 (label 1) is a negative; id 0 (same id) and id 2 (same label) are not; pool id 8 only
    assert mask[0].tolist() == [False, True, False, False, True, False, False, False]
    # query 1: ids 0 and 2 have another label; its own id excluded; pool neighbour 7 only
    assert mask[1].tolist() == [True, False, True, True, False, False, False, False]


def test_negative_mask_without_retrieval_has_no_pool_entries() -> None:
    bank = _bank_for_mask()
    mask = losses.negative_mask(bank, torch.tensor([0]), torch.tensor([0]), torch.tensor([0, 1, 0, 0, 0, 0, 0, 0]),
                                None)
    assert mask[0].tolist() == [False, True] + [False] * 6


def test_info_nce_matches_hand_computation() -> None:
    q = F.normalize(torch.tensor([[1.0, 0.0]]), dim=1)
    k = F.normalize(torch.tensor([[1.0, 1.0]]), dim=1)
    bank = F.normalize(torch.tensor([[0.0, 1.0], [-1.0, 0.0], [1.0, 0.0]]), dim=1)
    mask = torch.tensor([[True, True, False]])  # third entry masked out
    tau = 0.5
    got = losses.info_nce(q, k, bank, mask, tau)
    pos = math.exp((1 / math.sqrt(2)) / tau)
    negs = math.exp(0.0 / tau) + math.exp(-1.0 / tau)
    assert got.item() == pytest.approx(-math.log(pos / (pos + negs)), rel=1e-5)


def test_info_nce_with_no_negatives_is_zero() -> None:
    q = F.normalize(torch.randn(2, 4), dim=1)
    got = losses.info_nce(q, q, torch.randn(3, 4), torch.zeros(2, 3, dtype=torch.bool), 0.1)
    assert got.item() == pytest.approx(0.0, abs=1e-6)


def test_entropy_and_diversity() -> None:
    uniform = torch.zeros(4, 3)
    assert losses.entropy(uniform).item() == pytest.approx(math.log(3), rel=1e-5)
    confident_same = torch.tensor([[10.0, 0, 0]] * 4)
    confident_diverse = torch.tensor([[10.0, 0, 0], [0, 10.0, 0], [0, 0, 10.0], [10.0, 0, 0]])
    assert losses.diversity(confident_diverse) < losses.diversity(confident_same)


def test_dedup_sample_is_seeded_subset_of_candidates() -> None:
    cand = torch.arange(50).view(2, 25)
    a = dedup_sample(cand, 5, torch.Generator().manual_seed(1))
    b = dedup_sample(cand, 5, torch.Generator().manual_seed(1))
    c = dedup_sample(cand, 5, torch.Generator().manual_seed(2))
    assert torch.equal(a, b) and not torch.equal(a, c)
    for row, cands in zip(a, cand, strict=True):
        assert len(set(row.tolist())) == 5 and set(row.tolist()) <= set(cands.tolist())


def test_dedup_sample_spreads_over_all_candidates() -> None:
    cand = torch.arange(10).repeat(2000, 1)
    picks = dedup_sample(cand, 2, torch.Generator().manual_seed(0)).flatten()
    counts = torch.bincount(picks, minlength=10).float()
    assert counts.min() > 0.8 * counts.mean()  # uniform, not the top-k


def test_dedup_sample_never_picks_missing_results() -> None:
    cand = torch.tensor([[3, -1, 5, -1, 9, -1]])
    for seed in range(20):
        got = dedup_sample(cand, 3, torch.Generator().manual_seed(seed))
        assert sorted(got[0].tolist()) == [3, 5, 9]


def test_random_neighbours_distinct_and_in_range() -> None:
    got = random_neighbours(4, 7, 3, torch.Generator().manual_seed(0))
    assert got.shape == (4, 3) and int(got.max()) < 7
    assert all(len(set(r.tolist())) == 3 for r in got)


def test_schedule_warmup_then_cosine() -> None:
    f = lr_lambda(100, 0.1)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0) and f(55) == pytest.approx(0.5, abs=0.01)
    assert f(99) < 0.01


def test_epoch_batches_cover_and_agree_with_steps_per_epoch() -> None:
    for n, bs in [(10, 4), (9, 4), (2, 32), (33, 32), (64, 32)]:
        batches = epoch_batches(n, bs, torch.Generator().manual_seed(0))
        assert len(batches) == steps_per_epoch(n, bs)
        assert all(len(b) >= 2 for b in batches)

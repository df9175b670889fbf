"""AdaContrast pieces on tiny hand-made tensors and one step on a tiny CPU classifier."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from t3ar.method.adacontrast import (
    AdaContrastState,
    View,
    class_aware_info_nce,
    diversity_loss,
    fifo_write,
    momentum_update,
    soft_knn_refine,
    views_of,
)
from t3ar.models.classifier import Classifier


class TinyBackbone(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.num_features = 8

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _tiny(seed: int = 0) -> Classifier:
    torch.manual_seed(seed)
    return Classifier(TinyBackbone(), 8, 3, 16)


def _plain(x: torch.Tensor) -> torch.Tensor:
    return x.float() / 127.5 - 1.0


_BANK = torch.tensor([[5.0, 0.5], [1.0, -0.2], [1.0, 0.3], [0.2, 0.1], [0.0, 1.0], [-1.0, 0.0]])
_ONE_HOT = torch.eye(3)[torch.tensor([1, 1, 0, 0, 2, 0])]


def test_soft_knn_votes_over_cosine_neighbours() -> None:
    # query [1,0]: cosine order a(.995) b(.981) c(.958) d(.894); Euclidean would pick b, c, d (-> class 0)
    # query [0,2]: cosine order e(1) d(.447) c(.287)
    labels, probs = soft_knn_refine(torch.tensor([[1.0, 0.0], [0.0, 2.0]]), _BANK, _ONE_HOT, num_neighbors=3)
    assert labels.tolist() == [1, 0]
    assert torch.allclose(probs, torch.tensor([[1 / 3, 2 / 3, 0.0], [2 / 3, 0.0, 1 / 3]]))
    labels1, probs1 = soft_knn_refine(torch.tensor([[1.0, 0.0]]), _BANK, _ONE_HOT, num_neighbors=1)
    assert labels1.tolist() == [1] and torch.equal(probs1, _ONE_HOT[:1])


def test_soft_knn_averages_soft_probs_not_votes() -> None:
    bank_probs = torch.tensor([[0.45, 0.55], [0.45, 0.55], [0.95, 0.05], [0.0, 1.0]])
    bank = torch.tensor([[1.0, 0.0], [1.0, 0.01], [1.0, -0.01], [-1.0, 0.0]])
    labels, probs = soft_knn_refine(torch.tensor([[1.0, 0.0]]), bank, bank_probs, num_neighbors=3)
    # two of three neighbours vote class 1 by argmax, but the mean prob is [0.617, 0.383] -> class 0
    assert labels.tolist() == [0]
    assert torch.allclose(probs, torch.tensor([[1.85 / 3, 1.15 / 3]]))


def test_momentum_update_is_exact_ema_of_parameters_only() -> None:
    key, query = _tiny(0), _tiny(1)
    key.train()
    key(torch.randn(4, 3, 8, 8))  # give the key BN running stats that differ from the query's
    k0 = [p.detach().clone() for p in key.parameters()]
    q0 = [p.detach().clone() for p in query.parameters()]
    kb0 = [b.clone() for b in key.buffers()]
    momentum_update(key, query, 0.9)
    for pk, k, q in zip(key.parameters(), k0, q0, strict=True):
        assert torch.equal(pk.detach(), k * 0.9 + q * (1.0 - 0.9))
    assert any(not torch.equal(pk, k) for pk, k in zip(key.parameters(), k0, strict=True))
    assert all(torch.equal(p, q) for p, q in zip(query.parameters(), q0, strict=True))
    assert all(torch.equal(b, b0) for b, b0 in zip(key.buffers(), kb0, strict=True))


def test_class_aware_info_nce_hand_computed_and_masks_same_label() -> None:
    q, k = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.6, 0.8]])
    queue = torch.tensor([[0.0, 1.0], [1.0, 0.0], [-1.0, 0.0]])
    queue_labels, pseudo = torch.tensor([0, 1, 2]), torch.tensor([1])
    loss = class_aware_info_nce(q, k, queue, queue_labels, pseudo, temperature=0.5)
    # logits: pos 0.6/0.5=1.2, negatives 0 and -2 (entry 1 has the query's label: masked)
    expected = -math.log(math.exp(1.2) / (math.exp(1.2) + math.exp(0.0) + math.exp(-2.0)))
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    moved_masked = queue.clone()
    moved_masked[1] = torch.tensor([0.6, 0.8])
    assert class_aware_info_nce(q, k, moved_masked, queue_labels, pseudo, 0.5).item() == pytest.approx(expected)
    moved_neg = queue.clone()
    moved_neg[0] = torch.tensor([0.6, 0.8])
    assert class_aware_info_nce(q, k, moved_neg, queue_labels, pseudo, 0.5).item() != pytest.approx(expected)
    # with a label no queue entry carries, the masked entry counts again (logit 2.0)
    unmasked = -math.log(math.exp(1.2) / (math.exp(1.2) + 1 + math.exp(2.0) + math.exp(-2.0)))
    assert class_aware_info_nce(q, k, queue, queue_labels, torch.tensor([5]), 0.5).item() == pytest.approx(unmasked)


def test_class_aware_info_nce_gradient_reaches_q_only() -> None:
    q = F.normalize(torch.randn(3, 4), dim=1).requires_grad_(True)
    k = F.normalize(torch.randn(3, 4), dim=1).requires_grad_(True)
    loss = class_aware_info_nce(q, k, F.normalize(torch.randn(5, 4), dim=1), torch.arange(5) % 3,
                                torch.tensor([0, 1, 2]), 0.07)
    loss.backward()
    assert q.grad is not None and q.grad.abs().sum() > 0 and k.grad is None


def test_diversity_loss_is_negative_entropy_of_mean_prediction() -> None:
    p = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.2, 0.7]])
    expected = 0.8 * math.log(0.4) + 0.2 * math.log(0.2)  # p_mean = [0.4, 0.2, 0.4]
    assert diversity_loss(p.log()).item() == pytest.approx(expected, rel=1e-5)
    assert diversity_loss(torch.zeros(5, 4)).item() == pytest.approx(-math.log(4), rel=1e-5)
    assert diversity_loss(torch.tensor([[20.0, 0.0], [20.0, 0.0]])).item() == pytest.approx(0.0, abs=1e-6)


def test_fifo_write_wraps_and_keeps_newest() -> None:
    buf = torch.zeros(4, dtype=torch.long)
    ptr = fifo_write(buf, 0, torch.tensor([1, 2, 3]))
    assert ptr == 3 and buf.tolist() == [1, 2, 3, 0]
    ptr = fifo_write(buf, ptr, torch.tensor([4, 5, 6]))
    assert ptr == 2 and buf.tolist() == [5, 6, 3, 4]  # slots 3, 0, 1: the oldest first
    ptr = fifo_write(buf, ptr, torch.arange(10, 16))  # 6 rows into 4 slots, as if written one by one
    assert ptr == 0 and buf.tolist() == [12, 13, 14, 15]


def _views(seed: int) -> tuple[View, View]:
    g = torch.Generator().manual_seed(seed)

    def weak(x: torch.Tensor) -> torch.Tensor:
        return _plain(x).flip(-1)

    def strong(x: torch.Tensor) -> torch.Tensor:
        return _plain(x) + 0.3 * torch.randn(x.shape, generator=g)

    return weak, strong


def test_create_builds_queue_and_bank_from_eval_pass() -> None:
    model = _tiny()
    model.train()
    target = torch.randint(0, 256, (10, 3, 16, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    st = AdaContrastState.create(model, target, plain=_plain, queue_size=7, generator=torch.Generator().manual_seed(0),
                                 eval_batch_size=4)
    assert model.training and st.key_model.training  # mode restored; copy taken after
    assert st.queue_feats.shape == (7, 16) and torch.allclose(st.queue_feats.norm(dim=1), torch.ones(7))
    assert st.queue_labels.min() >= 0 and st.queue_labels.max() < 3
    model.eval()
    with torch.no_grad():
        feats, logits = model.forward_all(_plain(target))
    # bank = a permutation of the eval-mode features/probs of the whole target set
    assert st.bank_feats.shape == (10, 16)
    d = torch.cdist(st.bank_feats, feats)
    match = d.argmin(dim=1)
    assert sorted(match.tolist()) == list(range(10)) and d.min(dim=1).values.max() < 1e-5
    assert not torch.equal(match, torch.arange(10))
    assert torch.allclose(st.bank_probs, logits.softmax(dim=1)[match], atol=1e-6)
    assert not any(p.requires_grad for p in st.key_model.parameters())
    cut = AdaContrastState.create(model, target, plain=_plain, queue_size=7, generator=torch.Generator(),
                                  bank_size=6)
    assert cut.bank_feats.shape == (6, 16)


def test_one_step_loss_updates_key_queue_and_bank() -> None:
    model = _tiny()
    target = torch.randint(0, 256, (10, 3, 16, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    st = AdaContrastState.create(model, target, plain=_plain, queue_size=7, momentum=0.9,
                                 generator=torch.Generator().manual_seed(0))
    model.train()
    with torch.no_grad():  # the query drifts away from the key, so the EMA has something to do
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape))
    st.num_neighbors = 1  # one-hot bank probs by row: the pseudo-label is the nearest row's class
    st.bank_probs = torch.eye(3)[torch.arange(10) % 3]
    key0 = [p.detach().clone() for p in st.key_model.parameters()]
    query0 = [p.detach().clone() for p in model.parameters()]
    bank_feats0, bank_probs0, queue0 = st.bank_feats.clone(), st.bank_probs.clone(), st.queue_feats.clone()
    weak, strong = _views(3)
    x = target[:6]
    total, parts = st.loss(model, *views_of(x, weak, strong))
    assert torch.isfinite(total)
    ce, ins, div = (float(parts[name]) for name in ("ce", "ins", "div"))
    assert total.item() == pytest.approx(ce + ins + div, rel=1e-5) and ins >= 0 and div < 0
    total.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    assert all(p.grad is None for p in st.key_model.parameters())
    for pk, k, q in zip(st.key_model.parameters(), key0, query0, strict=True):
        assert torch.allclose(pk, k * 0.9 + q * 0.1, atol=1e-7)
    # queue: 6 keys written at slots 0..5 with the refined labels; bank: 6 rows from the key model's weak view
    pseudo = parts["pseudo_labels"]
    assert isinstance(pseudo, torch.Tensor)
    assert st.queue_ptr == 6 and st.bank_ptr == 6
    assert torch.equal(st.queue_labels[:6], pseudo) and torch.equal(st.queue_feats[6], queue0[6])
    assert torch.allclose(st.queue_feats[:6].norm(dim=1), torch.ones(6))
    assert torch.equal(st.bank_feats[6:], bank_feats0[6:]) and not torch.equal(st.bank_feats[:6], bank_feats0[:6])
    weak2, strong2 = _views(3)  # replay the same draws: weak, strong (query), strong (key)
    x_w, x_q, x_k = weak2(x), strong2(x), strong2(x)
    with torch.no_grad():  # params unchanged since loss() (no step) and BN uses batch stats: same outputs
        kf, kl = st.key_model.forward_all(x_w)
        qf, _ = model.forward_all(x_w)
        fq, lq = model.forward_all(x_q)
        k = F.normalize(st.key_model.features(x_k), dim=1)
    assert torch.allclose(st.bank_feats[:6], kf, atol=1e-5)
    assert torch.allclose(st.bank_probs[:6], kl.softmax(dim=1), atol=1e-6)
    # pseudo-labels = soft-kNN of the current model's weak features against the bank before the update
    assert torch.equal(pseudo, soft_knn_refine(qf, bank_feats0, bank_probs0, 1)[0])
    assert len(set(pseudo.tolist())) > 1
    assert torch.allclose(st.queue_feats[:6], k, atol=1e-6)
    assert ce == pytest.approx(F.cross_entropy(lq, pseudo).item(), rel=1e-5)
    assert div == pytest.approx(diversity_loss(lq).item(), rel=1e-5)
    expected_ins = class_aware_info_nce(F.normalize(fq, dim=1), k, st.queue_feats, st.queue_labels, pseudo, 0.07)
    assert ins == pytest.approx(expected_ins.item(), rel=1e-5)
    # a second step wraps the queue pointer (6 + 6) % 7 and the bank pointer (6 + 6) % 10; the key model
    # follows the query's per-module modes (a BN put in eval on the query is in eval on the key too)
    model.backbone.body[1].eval()
    st.loss(model, *views_of(x, weak, strong))
    assert st.key_model.training and not st.key_model.backbone.body[1].training
    assert st.queue_ptr == 5 and st.bank_ptr == 2

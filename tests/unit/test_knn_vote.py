"""Soft k-NN voting for the T3AR family's pseudo-labels (issue 33, t3ar.method.vote), on tiny tensors."""

import math

import pytest
import torch
import torch.nn.functional as F
from tiny_models import tiny_problem

from t3ar.method.adapt import AdaptResult, adapt
from t3ar.method.bank import MemoryBank
from t3ar.method.config import adapt_config
from t3ar.method.vote import vote, voters
from t3ar.models.classifier import Classifier

C = 3


def _logits(cls: int, strength: float = 5.0) -> torch.Tensor:
    return F.one_hot(torch.tensor(cls), C).float() * strength


def _bank() -> MemoryBank:
    """Target entries near e0 say class 0, near e1 class 1; pool entry 0 (labelled 2) and 1 (unlabelled) sit at
    e2, with logits that say class 1."""
    bank = MemoryBank(16, 3, C)
    e = torch.eye(3)
    bank.enqueue(torch.stack([e[0], e[0], e[0], e[1], e[1]]), torch.arange(5),
                 logits=torch.stack([_logits(0)] * 3 + [_logits(1)] * 2))
    bank.enqueue(torch.stack([e[2], e[2]]), torch.tensor([0, 1]), logits=torch.stack([_logits(1)] * 2),
                 from_pool=True)
    return bank.live()


def test_target_entries_vote_with_their_probabilities_and_unlabelled_pool_entries_never() -> None:
    feats, probs = voters(_bank())
    assert len(feats) == 5  # the two pool entries are left out
    assert torch.allclose(probs.sum(1), torch.ones(5)) and probs[:3].argmax(1).tolist() == [0, 0, 0]


def test_a_labelled_pool_entry_votes_with_its_label_one_hot() -> None:
    known = torch.tensor([2, -1])  # pool id 0 carries class 2, pool id 1 none
    feats, probs = voters(_bank(), known)
    assert len(feats) == 6
    assert probs[-1].tolist() == [0.0, 0.0, 1.0]


def test_the_vote_follows_the_nearest_entries_not_the_querys_own_logits() -> None:
    q = torch.tensor([[1.0, 0.1, 0.0], [0.1, 1.0, 0.0], [0.0, 0.2, 1.0]])
    assert vote(q, _bank(), 2).tolist() == [0, 1, 1]  # the third query's nearest voters are target entries
    assert vote(q, _bank(), 2, torch.tensor([2, -1]))[2].item() == 2  # the labelled pool entry now decides it
    # more neighbours than voters: every voter counts
    assert vote(q, _bank(), 100).tolist() == [0, 0, 0]


def test_a_bank_without_voters_is_refused() -> None:
    bank = MemoryBank(4, 3, C)
    bank.enqueue(torch.eye(3)[:1], torch.tensor([0]), logits=_logits(1)[None], from_pool=True)
    with pytest.raises(ValueError, match="at least one voter"):
        vote(torch.eye(3)[:1], bank.live(), 3)


def _run(**over: object) -> tuple[Classifier, AdaptResult]:
    model, target, pool, nbr = tiny_problem(n_pool=9)
    cfg = adapt_config(**{"method": "t3ar", "k": 3, "epochs": 3, "batch_size": 4, "bank_size": 64,
                         "train_groups": None, **over})
    res = adapt(model, target, cfg, mean=(0.5,) * 3, std=(0.5,) * 3, neighbours=nbr, pool_images=pool,
                device=torch.device("cpu"), pool_labels=torch.tensor([0, 1, 2, -1, -1, 0, 1, -1, 2]),
                labels=torch.arange(len(target)) % 3 if over.get("mode") == "train" else None)
    return model, res


def _same(a: Classifier, b: Classifier) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_the_family_trains_on_the_voted_pseudo_labels_at_test_time_only() -> None:
    plain, _ = _run()
    voted, res = _run(knn_refine=True, refine_neighbors=3)
    assert not _same(plain, voted) and all(math.isfinite(h.loss) for h in res.history)
    labelled, _ = _run(knn_refine=True, knn_refine_labelled=True, refine_neighbors=3)
    assert not _same(voted, labelled)  # labelled neighbours are in the bank and vote
    # train time: true labels, nothing to refine
    trained, _ = _run(mode="train")
    trained_voted, _ = _run(mode="train", knn_refine=True, refine_neighbors=3)
    assert _same(trained, trained_voted)


def test_knn_refine_is_a_family_option_and_labelled_votes_need_it() -> None:
    with pytest.raises(ValueError, match="T3AR family"):
        adapt_config(method="adacontrast", knn_refine=True)
    with pytest.raises(ValueError, match="needs knn_refine"):
        adapt_config(method="t3ar", knn_refine_labelled=True)

"""Label-free selection criteria (t3ar.method.selection): values computed by hand on small tensors."""

import math

import pytest
import torch

from t3ar.method.selection import (
    agreement,
    criteria,
    information_maximisation,
    neg_entropy,
    soft_neighbourhood_density,
)


def test_entropy_is_minus_the_mean_prediction_entropy() -> None:
    uniform = torch.zeros(3, 4)  # softmax = 1/4 everywhere: entropy log 4
    assert neg_entropy(uniform) == pytest.approx(-math.log(4))
    confident = torch.tensor([[100.0, 0.0, 0.0, 0.0], [0.0, 100.0, 0.0, 0.0]])
    assert neg_entropy(confident) == pytest.approx(0.0, abs=1e-6)
    # one sample p = (0.5, 0.5): log 2; another certain: 0 -> mean log 2 / 2
    mixed = torch.tensor([[0.0, 0.0], [100.0, 0.0]])
    assert neg_entropy(mixed) == pytest.approx(-math.log(2) / 2, abs=1e-6)
    with pytest.raises(ValueError):
        neg_entropy(torch.zeros(0, 3))


def test_information_maximisation_rewards_confident_and_diverse() -> None:
    diverse = torch.tensor([[100.0, 0.0], [0.0, 100.0]])  # marginal (0.5, 0.5): log 2; each certain: 0
    collapsed = torch.tensor([[100.0, 0.0], [100.0, 0.0]])  # marginal certain: 0; each certain: 0
    assert information_maximisation(diverse) == pytest.approx(math.log(2), abs=1e-6)
    assert information_maximisation(collapsed) == pytest.approx(0.0, abs=1e-6)
    assert information_maximisation(torch.zeros(2, 2)) == pytest.approx(0.0, abs=1e-6)  # unsure: log 2 - log 2
    # entropy alone cannot tell the collapsed model from the diverse one: IM can
    assert neg_entropy(diverse) == pytest.approx(neg_entropy(collapsed), abs=1e-6)


def test_agreement_is_the_share_of_equal_predictions() -> None:
    assert agreement(torch.tensor([0, 1, 2, 3]), torch.tensor([0, 1, 0, 0])) == 0.5
    with pytest.raises(ValueError):
        agreement(torch.tensor([0, 1]), torch.tensor([0]))


def test_snd_by_hand() -> None:
    # three samples: a and b identical, c orthogonal. Row a: similarities to b = 1, to c = 0 (over T = 0.05):
    # softmax (1/(1+e^-20), e^-20/(1+e^-20)); row c: both 0 -> (1/2, 1/2), entropy log 2
    f = torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0]])
    q = 1 / (1 + math.exp(-20))
    h_ab = -(q * math.log(q) + (1 - q) * math.log(1 - q))
    assert soft_neighbourhood_density(f) == pytest.approx((2 * h_ab + math.log(2)) / 3, rel=1e-5)
    # a higher temperature spreads every row: a denser neighbourhood
    assert soft_neighbourhood_density(f, temperature=1.0) > soft_neighbourhood_density(f)
    with pytest.raises(ValueError):
        soft_neighbourhood_density(f[:1])
    with pytest.raises(ValueError):
        soft_neighbourhood_density(f, temperature=0.0)


def test_criteria_of_one_model() -> None:
    logits = torch.tensor([[3.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 3.0]])
    got = criteria(logits, torch.tensor([0, 1, 1]))
    assert set(got) == {"entropy", "im", "snd", "agreement"}
    assert got["agreement"] == pytest.approx(2 / 3)
    assert got["entropy"] == pytest.approx(neg_entropy(logits))
    assert got["snd"] == pytest.approx(soft_neighbourhood_density(logits.softmax(1)))
    assert "agreement" not in criteria(logits)

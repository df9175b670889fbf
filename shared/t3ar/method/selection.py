"""Label-free model selection criteria: scores of an adapted model on its unlabelled target. Pure torch.

Every score is "higher is better" as the literature uses it, so two candidates compare by their scores alone:

* :func:`neg_entropy`: minus the mean prediction entropy (confident predictions; TENT's objective).
* :func:`information_maximisation`: the marginal entropy minus the mean entropy (confident *and* diverse: SHOT's
  IM objective, negated so that higher is better).
* :func:`agreement`: the share of predictions equal to a reference model's (e.g. bn-adapt's: how far adaptation
  moved from a safe start).
* :func:`soft_neighbourhood_density`: SND (Saito et al., ICCV 2021): the mean entropy of each target sample's
  softmax over its similarities to the other target samples (temperature 0.05); high when samples sit in dense
  neighbourhoods. Saito et al. compute it on the softmax outputs; any features may be given.

Entropies are in nats.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SND_TEMPERATURE = 0.05


def _entropy(p: torch.Tensor) -> torch.Tensor:
    return -(p * torch.log(p.clamp_min(1e-12))).sum(-1)


def neg_entropy(logits: torch.Tensor) -> float:
    """Minus the mean entropy of softmax(``logits``) [N, C]; ValueError when empty."""
    if logits.ndim != 2 or len(logits) == 0:
        raise ValueError("logits must be a non-empty [N, C] tensor")
    return -float(_entropy(logits.float().softmax(1)).mean())


def information_maximisation(logits: torch.Tensor) -> float:
    """H(mean prediction) − mean H(prediction) of softmax(``logits``) [N, C]: minus SHOT's IM loss."""
    if logits.ndim != 2 or len(logits) == 0:
        raise ValueError("logits must be a non-empty [N, C] tensor")
    p = logits.float().softmax(1)
    return float(_entropy(p.mean(0)) - _entropy(p).mean())


def agreement(predictions: torch.Tensor, reference: torch.Tensor) -> float:
    """Share of ``predictions`` (class indices [N]) equal to ``reference``'s; ValueError on a length mismatch."""
    if predictions.shape != reference.shape or predictions.ndim != 1 or len(predictions) == 0:
        raise ValueError("predictions and reference must be non-empty [N] tensors of one length")
    return float((predictions == reference).float().mean())


def soft_neighbourhood_density(features: torch.Tensor, temperature: float = SND_TEMPERATURE) -> float:
    """SND of ``features`` [N, D] (N >= 2): rows L2-normalised, cosine similarities to the *other* samples divided
    by ``temperature``, softmax per row, mean entropy of those rows."""
    if features.ndim != 2 or len(features) < 2:
        raise ValueError("features must be an [N, D] tensor with N >= 2")
    if temperature <= 0:
        raise ValueError("temperature must be positive")
    z = F.normalize(features.float(), dim=1)
    sim = z @ z.T / temperature
    sim.fill_diagonal_(float("-inf"))  # a sample is not its own neighbour
    return float(_entropy(sim.softmax(1)).mean())


def criteria(logits: torch.Tensor, reference_predictions: torch.Tensor | None = None) -> dict[str, float]:
    """Every criterion of one model on its target from its logits (SND on the softmax outputs, as Saito et al.);
    ``agreement`` only when the reference's predictions are given."""
    out = {"entropy": neg_entropy(logits), "im": information_maximisation(logits),
           "snd": soft_neighbourhood_density(logits.float().softmax(1)) if len(logits) >= 2 else float("nan")}
    if reference_predictions is not None:
        out["agreement"] = agreement(logits.argmax(1), reference_predictions)
    return out

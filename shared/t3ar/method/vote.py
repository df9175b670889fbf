"""Soft k-NN voting for the T3AR family's pseudo-labels (``AdaptConfig.knn_refine``).

AdaContrast refines a pseudo-label by the neighbours of the sample's feature: the mean class probabilities of the
``refine_neighbors`` nearest memory-bank entries (cosine), argmax. The T3AR family's own filtered pseudo-label is
the argmax of the mean logits stored for the sample's own id; with ``knn_refine`` the family votes as AdaContrast
does, over its bank: the voters are the bank's target entries (softmax of their stored logits) and, with
``knn_refine_labelled``, its pool entries that carry a pool label of one of the model's classes (that label,
one-hot). Unlabelled pool entries never vote: their logits are the model's guesses on another domain.

Pure torch over a :class:`~t3ar.method.bank.MemoryBank` view.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from t3ar.method.adacontrast import soft_knn_refine
from t3ar.method.bank import MemoryBank

__all__ = ["voters", "vote"]


@torch.no_grad()
def voters(bank: MemoryBank, pool_known: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(features [V, D], class probabilities [V, C]) of the bank's voters: every valid target entry, and with
    ``pool_known`` ([P] model classes of pool ids, -1 = none) every valid pool entry whose label is known."""
    valid = bank.valid
    voting = valid & ~bank.from_pool
    probs = torch.softmax(bank.logits.float(), dim=1)
    if pool_known is not None:
        on_pool = valid & bank.from_pool
        label = torch.where(on_pool, pool_known.to(bank.ids.device)[torch.where(on_pool, bank.ids, 0)], -1)
        known = label >= 0
        probs = torch.where(known[:, None], F.one_hot(label.clamp(min=0), probs.shape[1]).float(), probs)
        voting = voting | known
    return bank.feats[voting], probs[voting]


@torch.no_grad()
def vote(queries: torch.Tensor, bank: MemoryBank, neighbours: int,
         pool_known: torch.Tensor | None = None) -> torch.Tensor:
    """Pseudo-labels [B] of ``queries`` ([B, D] features): the argmax of the mean probabilities of their
    ``neighbours`` nearest voters (:func:`voters`; fewer when the bank holds fewer)."""
    feats, probs = voters(bank, pool_known)
    if not len(feats):
        raise ValueError("soft k-NN voting needs at least one voter in the bank (a target entry)")
    labels, _ = soft_knn_refine(queries, feats, probs, neighbours)
    return labels

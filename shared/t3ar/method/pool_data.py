"""Retrieved neighbours as data, and the false negatives among them: which neighbours of a batch are (pseudo-)
labelled like the queries that retrieved them. Pure torch.

A pool image gets a *filtered pseudo-label* of its own, as a target image does: the argmax of the mean of the
logits the bank stored for its strong views so far (:meth:`t3ar.method.bank.MemoryBank.mean_logits`). Two uses:

* **neighbours as data** (``AdaptConfig.pool_data_weight`` > 0; RA-TTA, Neural Priming, SuS-X, REACT and SWAT
  all use retrieved images as data): a distinct neighbour of the batch serves as a training example, with a
  cross-entropy of its weak view against its pseudo-label, when that pseudo-label is confident (max softmax >=
  ``pool_data_threshold``) and agrees with the pseudo-label (or label) of a query that retrieved it, at most
  ``pool_data_cap`` per step (the most confident), from the allowed sources only;
* **false-negative control** (``AdaptConfig.false_negatives``): a neighbour pseudo-labelled in the query's own
  class is not a negative of that query (the paper's rule for target entries, extended to the pool), or is a
  positive of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["PoolData", "agreement", "same_class_pool_entries", "select_pool_data"]


def agreement(nbr: torch.Tensor, y: torch.Tensor, pool_local: torch.Tensor, pool_pl: torch.Tensor) -> torch.Tensor:
    """[P'] bool: distinct neighbour ``pool_local[j]`` was retrieved by a query whose (pseudo-)label ``y`` is
    ``pool_pl[j]``. ``nbr`` [B, k] local pool indices (-1 = none), ``y`` [B], ``pool_local`` [P'] distinct local
    indices, ``pool_pl`` [P'] their pseudo-labels (-1 = none yet: never agrees)."""
    retrieved_by = (nbr[:, :, None] == pool_local[None, None, :]).any(1)  # [B, P']
    same = y[:, None] == pool_pl[None, :]
    return (retrieved_by & same).any(0) & (pool_pl >= 0)


@dataclass
class PoolData:
    """The neighbours of one step that serve as data: ``rows`` index the step's distinct neighbours
    (``pool_local``), ``labels`` are what each is trained towards."""

    rows: torch.Tensor  # [S] long, positions in pool_local
    labels: torch.Tensor  # [S] long


def select_pool_data(nbr: torch.Tensor, y: torch.Tensor, pool_local: torch.Tensor, mean_logits: torch.Tensor,
                     counts: torch.Tensor, *, threshold: float, cap: int,
                     allowed: torch.Tensor | None = None) -> PoolData:
    """Which distinct neighbours serve as data this step (see the module docstring).

    ``mean_logits`` [P', C] / ``counts`` [P']: the bank's mean logits of each distinct neighbour and how many
    views they average (0 = none: never chosen); ``allowed`` [P'] bool (their sources) or None. Ties in
    confidence keep the lower position (a stable order)."""
    probs = mean_logits.float().softmax(1)
    conf, pl = probs.max(1)
    pl = torch.where(counts > 0, pl, torch.full_like(pl, -1))
    ok = agreement(nbr.to(pl.device), y, pool_local.to(pl.device), pl) & (conf >= threshold)
    if allowed is not None:
        ok &= allowed.to(ok.device)
    rows = ok.nonzero().flatten()
    if len(rows) > cap:
        order = torch.sort(conf[rows], descending=True, stable=True).indices[:cap]
        rows = rows[order].sort().values
    return PoolData(rows, pl[rows])


def same_class_pool_entries(bank_from_pool: torch.Tensor, bank_pool_labels: torch.Tensor,
                            y: torch.Tensor) -> torch.Tensor:
    """[B, M] bool: pool entries of the bank whose pool pseudo-label (``bank_pool_labels`` [M], -1 = none) is the
    query's (pseudo-)label ``y`` [B]: the likely false negatives."""
    return bank_from_pool[None, :] & (bank_pool_labels[None, :] >= 0) & (bank_pool_labels[None, :] == y[:, None])

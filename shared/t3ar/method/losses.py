"""Losses of T3AR and the baselines. Pure functions of tensors."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

from t3ar.method.bank import MemoryBank


def negative_mask(bank: MemoryBank, query_ids: torch.Tensor, query_labels: torch.Tensor,
                  bank_labels: torch.Tensor, neighbour_ids: torch.Tensor | None,
                  pool_negatives: Literal["own", "all"] = "own") -> torch.Tensor:
    """[B, M] bool: which bank entries are negatives for each query.

    * target entries: a different (pseudo-)label than the query and not the query's own id;
    * pool entries, ``pool_negatives='own'``: only those that are the query's retrieved neighbours
      (``neighbour_ids`` [B, k] in the pool id space, -1 = none; None = no pool negatives);
      ``pool_negatives='all'``: every valid pool entry, for every query (``neighbour_ids`` unused).
    ``bank_labels`` [M] are the (pseudo-)labels of the bank's target entries.
    """
    target = bank.valid & ~bank.from_pool
    neg_t = (target[None, :] & (bank_labels[None, :] != query_labels[:, None])
             & (bank.ids[None, :] != query_ids[:, None]))
    pool = bank.valid & bank.from_pool
    if pool_negatives == "all":
        return neg_t | pool[None, :]
    if neighbour_ids is None or neighbour_ids.numel() == 0:
        return neg_t
    is_nbr = (bank.ids[None, :, None] == neighbour_ids[:, None, :]).any(-1)
    return neg_t | (pool[None, :] & is_nbr)


def neighbour_entries(bank: MemoryBank, neighbour_ids: torch.Tensor) -> torch.Tensor:
    """[B, M] bool: the valid pool entries of the bank that are each query's own retrieved neighbours
    (``neighbour_ids`` [B, k] in the pool id space, -1 = none)."""
    is_nbr = (bank.ids[None, :, None] == neighbour_ids[:, None, :]).any(-1)
    return is_nbr & (bank.valid & bank.from_pool)[None, :]


def info_nce_multi(logits: torch.Tensor, extra_positives: torch.Tensor) -> torch.Tensor:
    """InfoNCE with more than one positive per row: mean over rows of
    -log( Σ_{j ∈ pos(i)} exp(l_ij) / Σ_j exp(l_ij) ), where pos(i) is column 0 (the query's key) and the bank
    columns ``extra_positives`` [B, M] (their logits must be finite in ``logits`` [B, 1+M])."""
    pos = torch.cat([torch.ones_like(extra_positives[:, :1]), extra_positives], dim=1)
    num = torch.logsumexp(logits.masked_fill(~pos, float("-inf")), dim=1)
    return (torch.logsumexp(logits, dim=1) - num).mean()


def info_nce_logits(q: torch.Tensor, k: torch.Tensor, bank_feats: torch.Tensor, neg_mask: torch.Tensor,
                    temperature: float) -> torch.Tensor:
    """[B, 1+M] InfoNCE logits: column 0 = q_i·k_i/τ, column 1+j = q_i·b_j/τ where neg_mask[i, j], else -inf."""
    l_pos = (q * k).sum(1, keepdim=True)
    l_neg = (q @ bank_feats.T).masked_fill(~neg_mask, float("-inf"))
    return torch.cat([l_pos, l_neg], dim=1) / temperature


def info_nce_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Mean over rows of -log softmax(logits)[:, 0] (the positive is column 0)."""
    return F.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long, device=logits.device))


def info_nce(q: torch.Tensor, k: torch.Tensor, bank_feats: torch.Tensor, neg_mask: torch.Tensor,
             temperature: float) -> torch.Tensor:
    """InfoNCE with one positive ``k`` per query and the masked bank entries as negatives.

    q, k: [B, D] L2-normalised; bank_feats: [M, D] L2-normalised; neg_mask: [B, M] bool.
    loss_i = -log( exp(q_i·k_i/τ) / (exp(q_i·k_i/τ) + Σ_{j∈neg(i)} exp(q_i·b_j/τ)) ).
    """
    return info_nce_from_logits(info_nce_logits(q, k, bank_feats, neg_mask, temperature))


@torch.no_grad()
def denominator_share(logits: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """Scalar: the share of Σ_j exp(logits[i, j]) (the InfoNCE denominator) from bank entries ``columns``
    ([B, M] bool over logits[:, 1:]), averaged over rows; 0 where no selected column is finite."""
    p = logits.float().softmax(1)[:, 1:]
    return (p * columns).sum(1).mean()


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Mean per-sample Shannon entropy of softmax(logits) (TENT)."""
    logp = logits.log_softmax(1)
    return -(logp.exp() * logp).sum(1).mean()


def diversity(logits: torch.Tensor) -> torch.Tensor:
    """Negative entropy of the batch-mean prediction (SHOT's diversity term; minimise it)."""
    p_mean = logits.softmax(1).mean(0)
    return (p_mean * torch.log(p_mean + 1e-5)).sum()


def information_maximisation(logits: torch.Tensor) -> torch.Tensor:
    """SHOT-IM: confident per-sample predictions, diverse on average."""
    return entropy(logits) + diversity(logits)

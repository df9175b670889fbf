"""Losses of T3AR and the baselines. Pure functions of tensors."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from t3ar.method.bank import MemoryBank


def negative_mask(bank: MemoryBank, query_ids: torch.Tensor, query_labels: torch.Tensor,
                  bank_labels: torch.Tensor, neighbour_ids: torch.Tensor | None) -> torch.Tensor:
    """[B, M] bool: which bank entries are negatives for each query.

    * target entries: a different (pseudo-)label than the query and not the query's own id;
    * pool entries: only those that are the query's retrieved neighbours (``neighbour_ids`` [B, k]
      in the pool id space; None = no pool negatives).
    ``bank_labels`` [M] are the (pseudo-)labels of the bank's target entries.
    """
    target = bank.valid & ~bank.from_pool
    neg_t = (target[None, :] & (bank_labels[None, :] != query_labels[:, None])
             & (bank.ids[None, :] != query_ids[:, None]))
    if neighbour_ids is None or neighbour_ids.numel() == 0:
        return neg_t
    pool = bank.valid & bank.from_pool
    is_nbr = (bank.ids[None, :, None] == neighbour_ids[:, None, :]).any(-1)
    return neg_t | (pool[None, :] & is_nbr)


def info_nce(q: torch.Tensor, k: torch.Tensor, bank_feats: torch.Tensor, neg_mask: torch.Tensor,
             temperature: float) -> torch.Tensor:
    """InfoNCE with one positive ``k`` per query and the masked bank entries as negatives.

    q, k: [B, D] L2-normalised; bank_feats: [M, D] L2-normalised; neg_mask: [B, M] bool.
    loss_i = -log( exp(q_i·k_i/τ) / (exp(q_i·k_i/τ) + Σ_{j∈neg(i)} exp(q_i·b_j/τ)) ).
    """
    l_pos = (q * k).sum(1, keepdim=True)
    l_neg = q @ bank_feats.T
    l_neg = l_neg.masked_fill(~neg_mask, float("-inf"))
    logits = torch.cat([l_pos, l_neg], dim=1) / temperature
    target = torch.zeros(len(q), dtype=torch.long, device=q.device)
    return F.cross_entropy(logits, target)


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

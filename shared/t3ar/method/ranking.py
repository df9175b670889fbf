"""Retrieval that uses what the model knows (issue 52, item 2): pure ranking functions on tensors.

The pool's index ranks by R (the retriever's embedder). Measured on a labelled shift kept out of the repo, the
base model's features after its BatchNorm statistics are re-estimated on the target find the true class more often
than R (0.52 against 0.48 of the 5 nearest labelled items), and the model's own pseudo-label is right more often
than either (0.63). These functions turn that into ranking options; none of them searches the pool: the retriever
service stays the one place that does (and the one that keeps withdrawn items out), and these only re-order or
filter the candidates it returned, or merge answers of its label-filtered search.

- :func:`rerank_by_features`: the index's candidates re-ordered by the cosine similarity of the model's features;
- :func:`confident_pseudo_labels` and :func:`merge_class_conditional`: class-conditional retrieval, the nearest
  among the items labelled with a query's confident pseudo-label, falling back to the plain candidates;
- :func:`class_conditional_rank`: the same ranking computed exactly from a full score matrix (the reference the
  service's label-filtered search is tested against);
- :func:`candidate_count`: more candidates per query where the pool is large.

Candidates are [N, m] long rows of local pool indices, best first, -1 = missing.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["candidate_count", "class_conditional_rank", "confident_pseudo_labels", "merge_class_conditional",
           "rerank_by_features"]


def rerank_by_features(query_features: torch.Tensor, pool_features: torch.Tensor,
                       candidates: torch.Tensor) -> torch.Tensor:
    """Each row of ``candidates`` ([N, m] local indices into ``pool_features`` [P, d], -1 = missing) re-ordered by
    the cosine similarity of ``query_features`` [N, d] to the candidate's features, best first; ties keep the
    index's order; missing ones stay last. The set of candidates of a row never changes (only their order)."""
    n, m = candidates.shape
    if len(query_features) != n:
        raise ValueError(f"{len(query_features)} query feature rows for {n} candidate rows")
    if m == 0:
        return candidates.clone()
    q = F.normalize(query_features.float(), dim=1)
    p = F.normalize(pool_features.float(), dim=1)
    valid = candidates >= 0
    sims = torch.einsum("nd,nmd->nm", q, p[candidates.clamp(min=0)]) if len(p) else torch.zeros(n, m)
    sims = sims.masked_fill(~valid, -math.inf)
    # stable sort on (-similarity): equal similarities keep the index's order, missing (-inf) go last
    order = torch.sort(-sims, dim=1, stable=True).indices
    return candidates.gather(1, order)


def confident_pseudo_labels(logits: torch.Tensor, min_confidence: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(pseudo-labels [N], confident [N] bool): the arg-max class of each row of ``logits`` [N, C] and whether its
    softmax probability is at least ``min_confidence``."""
    probs = logits.float().softmax(dim=1)
    conf, pseudo = probs.max(dim=1)
    return pseudo, conf >= min_confidence


def merge_class_conditional(conditional: torch.Tensor, plain: torch.Tensor, confident: torch.Tensor) -> torch.Tensor:
    """[N, m] candidates: a confident row's class-conditional candidates (``conditional``: the nearest among items
    labelled with its pseudo-label, -1 where fewer exist), the rest of its slots filled with its ``plain``
    candidates not already in it, in their order; a row that is not confident keeps its plain candidates."""
    if conditional.shape != plain.shape or confident.shape != (len(plain),):
        raise ValueError("conditional and plain must be [N, m] and confident [N]")
    out = plain.clone()
    for i in torch.nonzero(confident).flatten().tolist():
        row = [int(c) for c in conditional[i] if c >= 0]
        seen = set(row)
        row += [int(c) for c in plain[i] if c >= 0 and int(c) not in seen]
        row = row[: plain.shape[1]]
        out[i] = torch.tensor(row + [-1] * (plain.shape[1] - len(row)), dtype=plain.dtype)
    return out


def class_conditional_rank(scores: torch.Tensor, pool_classes: torch.Tensor, pseudo: torch.Tensor,
                           confident: torch.Tensor, m: int) -> torch.Tensor:
    """The class-conditional ranking computed exactly from every score: ``scores`` [N, P] (query x pool item),
    ``pool_classes`` [P] (-1 = unlabelled). A confident query's m best items among those labelled with its
    pseudo-label, then its best other items; an unconfident query's m best items. [N, m], -1 where P < m."""
    n, p = scores.shape
    mm = min(m, p)
    same = (pool_classes.unsqueeze(0) == pseudo.unsqueeze(1)) & confident.unsqueeze(1)  # [N, P]
    by_score = torch.sort(-scores.float(), dim=1, stable=True).indices  # best first, ties by pool index
    other = (~same).gather(1, by_score).to(torch.int8)  # 0: of the pseudo-label's class
    order = by_score.gather(1, torch.sort(other, dim=1, stable=True).indices)  # that class first, by score
    out = torch.full((n, m), -1, dtype=torch.long)
    out[:, :mm] = order[:, :mm]
    return out


#: pools up to this size use the configured k·r candidates per query (the benchmarks' pools are a few thousand)
CANDIDATES_BASE_POOL = 10_000


def candidate_count(k: int, r: int, pool_size: int, *, cap: int) -> int:
    """Candidates to ask per query: k·r for a pool of up to :data:`CANDIDATES_BASE_POOL` items, doubled for every
    tenfold beyond it (a relevant item's rank grows with the pool: at 10x the items, about 10x as many unrelated
    ones sit between a query and it), at most ``cap`` (the retriever's T3AR_RETRIEVER_MAX_K) and never fewer than
    k."""
    base = k * r
    if pool_size <= CANDIDATES_BASE_POOL:
        return max(k, min(base, cap))
    decades = math.ceil(math.log10(pool_size / CANDIDATES_BASE_POOL) - 1e-9)
    return max(k, min(base * 2 ** decades, cap))

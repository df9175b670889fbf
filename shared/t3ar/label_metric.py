"""A retriever adapted to the pool's own labels (issue 52, item 2): a linear map fit on the labelled pool items' R
vectors under which items of one class are near, and rankings that use it on candidates the index returned.

R (ImageNet EfficientNet-Lite0 at 96 px) was never told what the pool's classes are: two emoji of one subcategory
drawn in different styles are often further apart than two emoji of different subcategories in one style. The
pool's labelled items say which directions of R separate its classes and which only carry what varies inside a
class (the style, the drawing). The map is **regularised linear discriminant analysis** (LDA), the simplest fit
that uses exactly that and nothing more:

- closed form (two symmetric eigendecompositions of a d x d matrix; no learning rate, epochs or seed), so the same
  pool gives the same map and a unit test can pin it;
- the within-class covariance S_w is shrunk towards a multiple of the identity, ``(1 - shrinkage) S_w +
  shrinkage tr(S_w)/d I`` (with d = 1280 and a few thousand items S_w is ill-conditioned; shrinkage keeps the
  directions with little within-class variance from being blown up by noise);
- the map whitens the shrunk S_w and keeps the at most C - 1 directions with between-class variance (the
  generalised eigenvectors of S_b against S_w), ordered by how well they separate the classes. A projection
  learnt with a cross-entropy or nearest-class-mean objective has the same aim with an optimiser's
  hyper-parameters added; LDA is its closed-form limit for shared Gaussian classes.

Vectors are L2-normalised before the map (R is searched by cosine) and centred on the fit's mean after it; rankings
compare the mapped vectors by cosine similarity.

Like :mod:`t3ar.method.ranking`, nothing here searches the pool: :func:`adapted_rerank` only re-orders the
candidates it is given and :func:`neighbour_vote` only counts them, so an item withdrawn from the pool (absent from
the index's answer) can never come back through them. The map must be fit on the pool's labelled items only, never
on a target's images or labels; refit it when the pool's labelled items change (a withdrawn item's vector then no
longer shapes it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from t3ar.method.ranking import rerank_by_features

__all__ = ["LabelMetric", "adapted_rerank", "fit_label_metric", "neighbour_vote", "refine_pseudo_labels"]

#: shrinkage of the within-class covariance towards the identity. Chosen on a pool alone, never on a target: on the
#: emoji kit's twitter + openmoji + openmoji-black pool, with one artwork family held out and the map fit on the
#: other, precision@5 of the held-out items' re-ranked R candidates (k=5, r=5) was, for shrinkage 0.1 / 0.3 / 0.5 /
#: 0.7 / 0.9: twitter 26.3 / 26.6 / 26.7 / 26.4 / 25.6, openmoji 24.5 / 25.4 / 25.3 / 25.1 / 24.5 (R alone: 25.3
#: and 23.0); flat between 0.3 and 0.7
DEFAULT_SHRINKAGE = 0.5


@dataclass(frozen=True)
class LabelMetric:
    """The fit map: ``transform(x) = normalize(x) @ projection - center`` ([d] -> [m])."""

    projection: torch.Tensor  # [d, m]
    center: torch.Tensor  # [m]
    classes: int  # how many classes the fit saw

    def transform(self, vectors: torch.Tensor) -> torch.Tensor:
        """Mapped vectors [N, m] of R vectors [N, d]."""
        if vectors.shape[-1] != self.projection.shape[0]:
            raise ValueError(f"vectors of dimension {vectors.shape[-1]}; the map was fit on {self.projection.shape[0]}")
        x = F.normalize(vectors.double(), dim=1)
        return (x @ self.projection - self.center).float()


def fit_label_metric(vectors: torch.Tensor, classes: torch.Tensor, *, shrinkage: float = DEFAULT_SHRINKAGE,
                     dims: int | None = None) -> LabelMetric:
    """Regularised LDA on the labelled items: ``vectors`` [P, d] (R vectors), ``classes`` [P] (class index; -1 =
    unlabelled, ignored). Keeps ``dims`` directions (default: at most C - 1, the number with between-class
    variance). ValueError when fewer than two classes are labelled or ``shrinkage`` is outside (0, 1]."""
    if not 0.0 < shrinkage <= 1.0:
        raise ValueError(f"shrinkage must be in (0, 1], got {shrinkage}")
    if vectors.ndim != 2 or classes.shape != (len(vectors),):
        raise ValueError("vectors must be [P, d] and classes [P]")
    keep = classes >= 0
    x = F.normalize(vectors[keep].double(), dim=1)
    y = classes[keep]
    labels, y = torch.unique(y, return_inverse=True)
    c, d = len(labels), x.shape[1]
    if c < 2:
        raise ValueError(f"{c} labelled class(es): the map needs at least two")
    counts = torch.bincount(y, minlength=c).double()
    means = torch.zeros(c, d, dtype=torch.float64).index_add_(0, y, x) / counts.unsqueeze(1)
    within = x - means[y]
    s_w = within.T @ within / len(x)
    s_w = (1 - shrinkage) * s_w + shrinkage * (torch.trace(s_w) / d) * torch.eye(d, dtype=torch.float64)
    evals, evecs = torch.linalg.eigh(s_w)
    whiten = evecs / evals.clamp(min=1e-12).sqrt()  # [d, d]: whiten.T @ s_w @ whiten = I
    mu = (counts @ means) / counts.sum()
    between = (means - mu) * counts.sqrt().unsqueeze(1) / counts.sum().sqrt()  # [C, d]: S_b = between.T @ between
    b = between @ whiten
    b_evals, b_evecs = torch.linalg.eigh(b.T @ b)  # ascending
    m = min(c - 1, d) if dims is None else max(1, min(dims, d))
    order = torch.argsort(b_evals, descending=True, stable=True)[:m]
    projection = whiten @ b_evecs[:, order]
    # a fixed sign per direction (an eigenvector's sign is arbitrary): the largest entry positive
    signs = torch.sign(projection.gather(0, projection.abs().argmax(dim=0, keepdim=True))).clamp(min=0) * 2 - 1
    projection = projection * signs
    return LabelMetric(projection, mu @ projection, c)


def adapted_rerank(metric: LabelMetric, query_vectors: torch.Tensor, pool_vectors: torch.Tensor,
                   candidates: torch.Tensor) -> torch.Tensor:
    """Each row of ``candidates`` ([N, m] local indices into ``pool_vectors`` [P, d], -1 = missing; the index's
    answer for the R vectors ``query_vectors`` [N, d]) re-ordered by cosine similarity in the mapped space, best
    first; ties keep the index's order, missing ones stay last. The set of a row's candidates never changes."""
    return rerank_by_features(metric.transform(query_vectors), metric.transform(pool_vectors), candidates)


def neighbour_vote(candidates: torch.Tensor, pool_classes: torch.Tensor, n_classes: int, k: int) -> torch.Tensor:
    """[N, n_classes] share of each class among the first ``k`` labelled candidates of each row (``candidates``
    [N, m] best first, -1 = missing; ``pool_classes`` [P], -1 = unlabelled); a row with none votes all zeros."""
    n = len(candidates)
    classes = torch.where(candidates >= 0, pool_classes[candidates.clamp(min=0)], -1) if candidates.numel() else \
        torch.full((n, 0), -1, dtype=torch.long)
    labelled = classes >= 0
    first = labelled & (labelled.long().cumsum(dim=1) <= k)
    votes = torch.zeros(n, n_classes, dtype=torch.float32)
    votes.scatter_add_(1, classes.clamp(min=0), first.float())
    total = votes.sum(dim=1, keepdim=True)
    return torch.where(total > 0, votes / total.clamp(min=1), votes)


def refine_pseudo_labels(logits: torch.Tensor, vote: torch.Tensor, weight: float,
                         min_confidence: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(refined pseudo-labels [N], confident [N] bool): the arg-max of ``(1 - weight) * softmax(logits) + weight *
    vote`` (the model's probabilities and the labelled neighbours' vote shares, both [N, C]) and whether that
    combined score is at least ``min_confidence``. ``weight`` 0 gives the model's own pseudo-labels."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"weight must be in [0, 1], got {weight}")
    if logits.shape != vote.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and vote {tuple(vote.shape)} differ")
    combined = (1 - weight) * logits.float().softmax(dim=1) + weight * vote.float()
    conf, pseudo = combined.max(dim=1)
    return pseudo, conf >= min_confidence

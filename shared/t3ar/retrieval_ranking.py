"""The retrieval options of issue 52 at the I/O edge: the base model's view of a target (BatchNorm statistics
re-estimated on it), ranked candidate search through a :class:`~t3ar.method.retrieval.NeighbourProvider`, and a
job's neighbour quality.

Every option searches the pool only through the provider (the retriever service, or a local pool in the CLI and
the benchmarks): ``index`` is its plain search; ``base-rerank`` re-orders the candidates that search returned
(:func:`t3ar.method.ranking.rerank_by_features`); ``class-conditional`` asks the provider's label-filtered search
(:class:`LabelSearch`) for the items labelled with a query's confident pseudo-label and merges them with the plain
candidates (:func:`t3ar.method.ranking.merge_class_conditional`). No option adds an id the provider did not answer,
so an item withdrawn from the pool reaches a job through none of them.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import numpy as np
import torch

from t3ar.data.images import to_tensor_uint8
from t3ar.errors import InvalidInputError
from t3ar.method.augment import Normalizer
from t3ar.method.bn_adapt import bn_adapt
from t3ar.method.config import AdaptConfig, train_groups, trained
from t3ar.method.neighbour_quality import NeighbourQuality, hit_rate, label_agreement, source_mix
from t3ar.method.ranking import (
    candidate_count,
    confident_pseudo_labels,
    merge_class_conditional,
    rerank_by_features,
)
from t3ar.method.retrieval import NeighbourProvider
from t3ar.models.classifier import Classifier, ModelSpec

#: the retrieval options' rankings (``RetrievalOptions.ranking``)
Ranking = Literal["index", "base-rerank", "class-conditional"]
RANKINGS: tuple[str, ...] = ("index", "base-rerank", "class-conditional")


@runtime_checkable
class LabelSearch(Protocol):
    """A provider that can search among the items of one label (the retriever's ``POST /search`` with ``label``)."""

    def search_label(self, queries: np.ndarray, k: int, label: str | None) -> tuple[np.ndarray, list[list[str]]]:
        ...


class BaseView:
    """The base model with its BatchNorm statistics re-estimated on the target (``bn-adapt``'s model, a copy: the
    job's model is untouched): its features and logits of any images."""

    def __init__(self, model: Classifier, target: torch.Tensor, *, mean: tuple[float, float, float],
                 std: tuple[float, float, float], device: torch.device, train_groups: int | None,
                 batch_size: int = 64, seed: int = 0, reestimate: bool = True) -> None:
        self.model = copy.deepcopy(model).to(device)
        self.norm = Normalizer(mean, std, device)
        if reestimate:  # (False: the base model as it is, for a benchmark's comparison)
            bn_adapt(self.model, target, train_groups=train_groups, batch_size=batch_size, norm=self.norm,
                     generator=torch.Generator().manual_seed(seed))
        self.model.eval()
        self.batch_size = batch_size

    @torch.no_grad()
    def features_logits(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(features [N, d], logits [N, C]) of uint8 images [N, 3, S, S], on the CPU."""
        feats, logits = [], []
        for start in range(0, len(images), 256):
            f, lg = self.model.forward_all(self.norm(images[start:start + 256]))
            feats.append(f.float().cpu())
            logits.append(lg.float().cpu())
        if not feats:
            return torch.empty(0, 0), torch.empty(0, 0)
        return torch.cat(feats), torch.cat(logits)


def _localise(ids: Sequence[Sequence[str]]) -> tuple[torch.Tensor, list[str]]:
    local: dict[str, int] = {}
    width = max((len(r) for r in ids), default=0)
    out = torch.full((len(ids), width), -1, dtype=torch.long)
    for i, row in enumerate(ids):
        for j, pid in enumerate(row):
            if pid:
                out[i, j] = local.setdefault(pid, len(local))
    return out, list(local)


def _rows(local: torch.Tensor, names: Sequence[str], score_of: Sequence[dict[str, float]],
          m: int) -> tuple[np.ndarray, list[list[str]]]:
    scores = np.full((len(local), m), -np.inf, dtype=np.float32)
    ids: list[list[str]] = []
    for i, row in enumerate(local.tolist()):
        pids = [names[c] if c >= 0 else "" for c in row][:m]
        pids += [""] * (m - len(pids))
        ids.append(pids)
        scores[i] = [score_of[i].get(p, -np.inf) if p else -np.inf for p in pids]
    return scores, ids


def ranked_search(provider: NeighbourProvider, queries: np.ndarray, m: int, ranking: str, *,
                  view: BaseView | None = None, target: torch.Tensor | None = None,
                  classes: Sequence[str] = (), pseudo: torch.Tensor | None = None,
                  confident: torch.Tensor | None = None, image_size: int = 0) -> tuple[np.ndarray, list[list[str]]]:
    """``m`` candidates per query (R vectors ``queries`` [N, d]) ranked by ``ranking``, as the provider's
    ``search`` answers them: (R scores [N, m], ids; '' and -inf where missing).

    ``base-rerank`` needs ``view``, ``target`` (the queries' uint8 images) and ``image_size`` (the candidates are
    fetched and seen by ``view``); ``class-conditional`` needs ``classes`` (the model's), ``pseudo`` and
    ``confident`` ([N]) and a :class:`LabelSearch` provider."""
    scores, ids = provider.search(queries, m)
    score_of = [{p: float(s) for p, s in zip(row, srow, strict=False) if p} for row, srow in zip(ids, scores,
                                                                                                 strict=True)]
    if ranking == "index":
        return scores, ids
    if ranking == "base-rerank":
        if view is None or target is None or not image_size:
            raise ValueError("base-rerank needs the base model's view, the target images and the image size")
        local, names = _localise(ids)
        images = [to_tensor_uint8(img, image_size) for img in provider.fetch(names)] if names else []
        pool = torch.stack(images) if images else torch.empty(0, 3, image_size, image_size, dtype=torch.uint8)
        pool_feats = view.features_logits(pool)[0]
        query_feats = view.features_logits(target)[0]
        return _rows(rerank_by_features(query_feats, pool_feats, local), names, score_of, m)
    if ranking == "class-conditional":
        if pseudo is None or confident is None or not classes:
            raise ValueError("class-conditional needs the model's classes and the queries' pseudo-labels")
        if not isinstance(provider, LabelSearch):
            raise InvalidInputError("this pool cannot search by label: class-conditional retrieval needs a "
                                    "retriever that answers label-filtered searches")
        cond_ids: list[list[str]] = [[""] * m for _ in range(len(queries))]
        for c in sorted({int(p) for p, ok in zip(pseudo.tolist(), confident.tolist(), strict=True) if ok}):
            rows = [i for i, (p, ok) in enumerate(zip(pseudo.tolist(), confident.tolist(), strict=True))
                    if ok and p == c]
            s_c, ids_c = provider.search_label(queries[rows], m, classes[c])
            for j, i in enumerate(rows):
                cond_ids[i] = list(ids_c[j]) + [""] * (m - len(ids_c[j]))
                score_of[i].update({p: float(s) for p, s in zip(ids_c[j], s_c[j], strict=False) if p})
        local, names = _localise([*cond_ids, *ids])
        merged = merge_class_conditional(local[:len(queries)], local[len(queries):], confident)
        return _rows(merged, names, score_of, m)
    raise ValueError(f"unknown ranking {ranking!r}; choose one of {', '.join(RANKINGS)}")


def class_indices(labels: Sequence[str | None], classes: Sequence[str]) -> list[int]:
    """Each label as an index into ``classes`` (-1: unlabelled, or a label that is not one of them)."""
    index = {c: i for i, c in enumerate(classes)}
    return [index.get(lab, -1) if lab else -1 for lab in labels]


def neighbour_quality(provider: NeighbourProvider, chosen: Sequence[Sequence[str]], classes: Sequence[str], *,
                      ranking: str, k: int, pseudo: torch.Tensor | None = None,
                      truth: torch.Tensor | None = None, truth_on: str | None = None,
                      truth_neighbours: Sequence[Sequence[str]] | None = None) -> NeighbourQuality:
    """A job's neighbour quality: ``chosen`` [N][k] pool ids drawn per target image ('' = missing); ``pseudo``
    [N] the target images' pseudo-labels; ``truth`` true labels of the queries of ``truth_neighbours`` (a
    holdout's neighbours ranked the same way) or, without them, of the target images themselves (a labelled
    target). Labels are read from the provider; the sources too."""
    def classes_of(rows: Sequence[Sequence[str]]) -> torch.Tensor:
        flat = [p for row in rows for p in row if p]
        lab = dict(zip(flat, class_indices(provider.labels(flat), classes), strict=True)) if flat else {}
        width = max((len(r) for r in rows), default=0)
        out = torch.full((len(rows), width), -1, dtype=torch.long)
        for i, row in enumerate(rows):
            for j, p in enumerate(row):
                if p:
                    out[i, j] = lab[p]
        return out

    drawn = classes_of(chosen)
    flat = [p for row in chosen for p in row if p]
    src = dict(zip(flat, provider.sources(flat), strict=True)) if flat else {}
    mix = source_mix([[src[p] if p else "" for p in row] for row in chosen])
    agree = label_agreement(drawn, pseudo) if pseudo is not None and len(drawn) else None
    prec = hits = None
    if truth is not None:
        rows = classes_of(truth_neighbours) if truth_neighbours is not None else drawn
        if len(rows):
            prec, hits = label_agreement(rows, truth), hit_rate(rows, truth)
    return NeighbourQuality(ranking, k, len(flat), agree, prec, truth_on if prec is not None else None, hits, mix)


#: the most candidates a scaled search asks per query (below the retriever's default T3AR_RETRIEVER_MAX_K of 1000)
MAX_CANDIDATES = 400


@dataclass
class RankContext:
    """What the options that use the model need: its view of the target, its classes, the input size and the
    confidence a class-conditional pseudo-label needs."""

    view: BaseView
    classes: Sequence[str]
    image_size: int
    min_confidence: float = 0.5

    @classmethod
    def for_job(cls, model: Classifier, target: torch.Tensor, config: AdaptConfig, spec: ModelSpec,
                device: torch.device, *, always: bool = False) -> RankContext | None:
        """The context of a job whose retrieval ranking uses the model (None for ``index`` and for random draws,
        unless ``always``)."""
        opts = config.retrieval_options
        if opts is None or (not always and (not needs_view(opts.ranking) or config.spec.retrieval == "random")):
            return None
        run = trained(config)  # a retrieval method trains: its config has the schedule the view's BatchNorm pass uses
        view = BaseView(model, target, mean=spec.backbone.mean, std=spec.backbone.std, device=device,
                        train_groups=train_groups(run), batch_size=run.batch_size, seed=config.seed)
        return cls(view, spec.classes, spec.image_size, opts.min_confidence)

    def pseudo_labels(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(pseudo-labels [N], confident [N]) of uint8 images under the view."""
        return confident_pseudo_labels(self.view.features_logits(images)[1], self.min_confidence)


def needs_view(ranking: str) -> bool:
    return ranking != "index"


def ranked_candidates(provider: NeighbourProvider, queries: np.ndarray, images: torch.Tensor, *, k: int, r: int,
                      ranking: str, candidates: str, context: RankContext | None
                      ) -> tuple[np.ndarray, list[list[str]]]:
    """The r·k candidates per query a retrieval job samples its k neighbours from, ranked by ``ranking`` from
    ``r·k`` (``candidates='fixed'``) or :func:`~t3ar.method.ranking.candidate_count` (``'scaled'``) asked of the
    provider: (R scores [N, r·k], ids; '' where missing)."""
    keep = k * r
    m = keep if candidates == "fixed" else candidate_count(k, r, provider.size(), cap=max(keep, MAX_CANDIDATES))
    if ranking == "index":
        scores, ids = provider.search(queries, m)
    else:
        if context is None:
            raise ValueError(f"ranking {ranking} needs the model's view of the target")
        pseudo = confident = None
        if ranking == "class-conditional":
            pseudo, confident = context.pseudo_labels(images)
        scores, ids = ranked_search(provider, queries, m, ranking, view=context.view, target=images,
                                    classes=context.classes, pseudo=pseudo, confident=confident,
                                    image_size=context.image_size)
    ids = [list(row[:keep]) + [""] * (keep - len(row[:keep])) for row in ids]
    out = np.full((len(ids), keep), -np.inf, dtype=np.float32)
    s = np.asarray(scores, dtype=np.float32).reshape(len(ids), -1)[:, :keep]
    out[:, :s.shape[1]] = s
    return out, ids


def job_quality(provider: NeighbourProvider, chosen: Sequence[Sequence[str]], images: torch.Tensor,
                context: RankContext, *, ranking: str, candidates: str, k: int, r: int,
                target_labels: torch.Tensor | None = None,
                holdout: tuple[torch.Tensor, torch.Tensor] | None = None) -> NeighbourQuality:
    """A retrieval job's neighbour quality: ``chosen`` the pool ids drawn per target image (``images``), their
    agreement with the view's pseudo-labels; precision@k against a ``holdout`` (its images searched and ranked
    the same way, the first k kept) or else the target's own ``target_labels`` (a labelled target)."""
    pseudo = context.view.features_logits(images)[1].argmax(1) if len(images) else torch.empty(0, dtype=torch.long)
    if holdout is not None and len(holdout[0]):
        hx, hy = holdout
        _, h_ids = ranked_candidates(provider, provider.embed(hx), hx, k=k, r=r, ranking=ranking,
                                     candidates=candidates, context=context)
        return neighbour_quality(provider, chosen, context.classes, ranking=ranking, k=k, pseudo=pseudo, truth=hy,
                                 truth_on="holdout", truth_neighbours=[row[:k] for row in h_ids])
    return neighbour_quality(provider, chosen, context.classes, ranking=ranking, k=k, pseudo=pseudo,
                             truth=target_labels, truth_on="target" if target_labels is not None else None)


def retrieval_quality(provider: NeighbourProvider, neighbours: torch.Tensor, pool_ids: Sequence[str],
                      target: torch.Tensor, config: AdaptConfig, spec: ModelSpec, device: torch.device, *,
                      model_before: Classifier | None, context: RankContext | None,
                      target_labels: torch.Tensor | None = None,
                      holdout: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict[str, object]:
    """A retrieval job's neighbour quality for its report (:meth:`NeighbourQuality.as_dict`): ``neighbours`` [N, k]
    local indices into ``pool_ids`` (-1 = missing). Pseudo-labels and precision need a view of the base model
    (``context``'s, or one made from ``model_before``); without either (no drawn neighbour is labelled) only the
    source mix is measured."""
    opts = config.retrieval_options
    if opts is None:
        raise ValueError(f"method {config.method} reads no pool")
    chosen = [[pool_ids[int(i)] if i >= 0 else "" for i in row] for row in neighbours.tolist()]
    ranking = opts.ranking if config.spec.retrieval != "random" else "random"
    if context is None and model_before is not None:
        context = RankContext.for_job(model_before, target, config, spec, device, always=True)
    if context is None:
        return neighbour_quality(provider, chosen, spec.classes, ranking=ranking, k=opts.k).as_dict()
    if config.spec.retrieval == "random":  # a random draw: the holdout's 'neighbours' would be random too
        holdout = None
    return job_quality(provider, chosen, target, context, ranking=ranking, candidates=opts.candidates, k=opts.k,
                       r=opts.r, target_labels=target_labels, holdout=holdout).as_dict()

"""The adaptation harness: the I/O edge around the pure method.

Loads the base checkpoint, prepares target tensors, asks a :class:`NeighbourProvider` for neighbours
(fixed for the job, or candidates to redraw from at every visit), fetches them, runs
:func:`t3ar.method.adapt.adapt`, evaluates, and returns everything needed to write an adapted checkpoint
with its lineage. Used by the CLI, the worker and the benchmarks alike.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from t3ar.data.datasets import ImageSet, adapted_rows, class_map_check, load_tensors
from t3ar.data.images import to_tensor_uint8
from t3ar.device import seed_everything
from t3ar.errors import DatasetError, InvalidInputError
from t3ar.method.adapt import AdaptResult, StepStats, adapt
from t3ar.method.augment import Normalizer
from t3ar.method.config import AdaptConfig
from t3ar.method.evaluate import evaluate
from t3ar.method.probe import Probe
from t3ar.method.retrieval import NeighbourProvider, dedup_sample, random_neighbours
from t3ar.models.checkpoint import CheckpointInfo, Lineage
from t3ar.models.classifier import Classifier
from t3ar.retrieval_ranking import RankContext, ranked_candidates, retrieval_quality

log = logging.getLogger(__name__)


@dataclass
class Retrieved:
    """Neighbours of every target image as local indices into ``pool_images`` (fetched once).

    ``candidates`` ([N, m] local indices, -1 = missing or dropped as a near-duplicate) is set when the benchmarks'
    probe sets ``redraw_neighbours``: then ``pool_images`` covers every candidate and ``neighbours`` is the first
    draw from them (what a fixed-neighbour run would use). None otherwise (only the k drawn are fetched).
    """

    neighbours: torch.Tensor  # [N, k] long, -1 = missing
    pool_images: torch.Tensor  # [P, 3, S, S] uint8
    pool_ids: list[str]  # local index -> pool id
    seconds_embed: float = 0.0
    seconds_search: float = 0.0
    seconds_fetch: float = 0.0
    candidates: torch.Tensor | None = None  # [N, m] long, -1 = missing; see above
    # what retrieval did, for people: SAMPLE_TARGETS targets' drawn neighbours (sample_rows) as (row, [(id, score)])
    # (score None for t3ar-random); reports show it next to the target image
    sample: list[tuple[int, list[tuple[str, float | None]]]] = field(default_factory=list)
    # the pool label of each of pool_ids (None = unlabelled); empty when the job's config does not read labels
    # (:func:`reads_pool_labels`)
    pool_labels: list[str | None] = field(default_factory=list)


@dataclass(frozen=True)
class LabelledUse:
    """A retrieved neighbour that served as labelled training data: its pool id, its label and in how many
    steps it served."""

    pool_id: str
    label: str
    uses: int


def reads_pool_labels(config: AdaptConfig) -> bool:
    """Whether a job reads its neighbours' pool labels: labelled neighbours as data, or false negatives told
    by their label."""
    return config.pool_use().labels


def pool_classes(pool_labels: Sequence[str | None], model_classes: Sequence[str]) -> torch.Tensor:
    """[P] each pool label as an index into the model's classes; -1 for none and for a label that is not one of
    the model's classes (such an item stays unlabelled: a contrastive negative)."""
    index = {c: i for i, c in enumerate(model_classes)}
    return torch.tensor([index.get(lab, -1) if lab else -1 for lab in pool_labels], dtype=torch.long)


SAMPLE_TARGETS = 8  # targets whose drawn neighbours a report records (AdaptOutcome.neighbour_sample)


def sample_rows(n: int, size: int = SAMPLE_TARGETS) -> list[int]:
    """``size`` target rows spread evenly over ``n`` (all of them when fewer): first, last and between."""
    if n <= size:
        return list(range(n))
    return sorted({round(j * (n - 1) / (size - 1)) for j in range(size)})


def _localise(rows: list[list[str]], width: int, local: dict[str, int]) -> torch.Tensor:
    """[N, width] local indices of pool ids (first-seen order, added to ``local``); '' and absent -> -1."""
    out = torch.full((len(rows), width), -1, dtype=torch.long)
    for i, row in enumerate(rows):
        for j, pid in enumerate(row):
            if pid:
                out[i, j] = local.setdefault(pid, len(local))
    return out


def near_duplicates(scores: np.ndarray, shape: tuple[int, int], threshold: float | None) -> torch.Tensor:
    """[N, m] bool: candidates whose retriever score is >= ``threshold`` (none when it is None).

    ``scores`` [N, c], c <= m (a provider may return fewer columns than asked); missing columns never match.
    """
    drop = torch.zeros(shape, dtype=torch.bool)
    if threshold is None:
        return drop
    s = torch.from_numpy(np.asarray(scores, dtype=np.float32).reshape(shape[0], -1))
    c = min(s.shape[1], shape[1])
    drop[:, :c] = s[:, :c] >= threshold
    return drop


def retrieve(provider: NeighbourProvider, target: torch.Tensor, config: AdaptConfig, image_size: int,
             generator: torch.Generator, *, fetch_batch: int = 256, context: RankContext | None = None,
             probe: Probe | None = None) -> Retrieved:
    """Nearest neighbours with dedup (``t3ar``) or uniformly random pool items (``t3ar-random``).

    ``t3ar``: the top r·k by the provider's search, minus near-duplicates (score >= ``dedup_threshold``),
    then k drawn uniformly with ``generator``. ``t3ar-random``: k (with ``redraw_neighbours``: r·k,
    capped at the pool size, the first k of which are the same draw) distinct random pool items; the dedup
    threshold does not apply (there are no scores). With ``redraw_neighbours`` the images of every
    candidate are fetched and returned with ``candidates``; otherwise only the k drawn are. ``generator`` is
    consumed identically either way, so both settings share the rest of the run's random streams.
    ``redraw_neighbours`` is the benchmarks' switch (:class:`~t3ar.method.probe.Probe`); the product never sets it.
    """
    t0 = time.perf_counter()
    opts = config.retrieval_options
    if opts is None:
        raise ValueError(f"method {config.method} reads no pool")
    n, k = len(target), opts.k
    redraw = probe is not None and probe.redraw_neighbours
    if provider.size() < k:
        raise InvalidInputError(f"the pool has {provider.size()} items; k={k} neighbours are needed per image")
    cand_rows: list[list[str]] | None = None
    dropped = 0
    sample: list[tuple[int, list[tuple[str, float | None]]]]
    if config.spec.retrieval == "random":
        all_ids = provider.all_ids()
        m = min(k * opts.r, len(all_ids)) if redraw else k
        rows = random_neighbours(n, len(all_ids), m, generator)  # its first k columns do not depend on m
        cand_rows = [[all_ids[int(i)] for i in row] for row in rows]
        chosen = [row[:k] for row in cand_rows]
        sample = [(i, [(pid, None) for pid in chosen[i] if pid]) for i in sample_rows(n)]
        t1 = t2 = time.perf_counter()
    else:
        queries = provider.embed(target)
        t1 = time.perf_counter()
        # the r*k candidates, ranked by opts.ranking (issue 52; the provider's search is the only pool search)
        scores, cand_ids = ranked_candidates(provider, queries, target, k=k, r=opts.r, ranking=opts.ranking,
                                             candidates=opts.candidates, context=context)
        vocab: dict[str, int] = {}
        cand = torch.full((n, k * opts.r), -1, dtype=torch.long)
        for i, row in enumerate(cand_ids):
            for j, pid in enumerate(row):
                if pid:
                    cand[i, j] = vocab.setdefault(pid, len(vocab))
        if cand.shape[1] < k:
            raise InvalidInputError("the pool returned fewer candidates than k")
        drop = near_duplicates(scores, (n, k * opts.r), opts.dedup_threshold) & (cand >= 0)
        dropped = int(drop.sum())
        cand[drop] = -1
        picked = dedup_sample(cand, k, generator)
        inv = {v: pid for pid, v in vocab.items()}
        chosen = [[inv[int(i)] if i >= 0 else "" for i in row] for row in picked]
        cand_rows = [[inv[int(i)] if i >= 0 else "" for i in row] for row in cand]
        sample = []
        for i in sample_rows(n):
            score_of = {pid: float(sc) for pid, sc in zip(cand_ids[i], np.asarray(scores)[i], strict=False) if pid}
            sample.append((i, [(pid, score_of.get(pid)) for pid in chosen[i] if pid]))
        t2 = time.perf_counter()
    local: dict[str, int] = {}
    neighbours = _localise(chosen, k, local)  # the drawn ones first: same local order as without redraw
    candidates = (_localise(cand_rows, max(map(len, cand_rows), default=k), local)
                  if (redraw and cand_rows is not None) else None)
    pool_ids = list(local)
    tensors: list[torch.Tensor] = []
    for start in range(0, len(pool_ids), fetch_batch):
        tensors += [to_tensor_uint8(img, image_size) for img in provider.fetch(pool_ids[start:start + fetch_batch])]
    pool_images = torch.stack(tensors) if tensors else torch.empty(0, 3, image_size, image_size, dtype=torch.uint8)
    t3 = time.perf_counter()
    labels = provider.labels(pool_ids) if reads_pool_labels(config) else []
    log.info("retrieved %d distinct pool images for %d targets (k=%d, r=%d, %s, redraw=%s, %d near-duplicates "
             "dropped)", len(pool_ids), n, k, opts.r, config.method, redraw, dropped)
    return Retrieved(neighbours, pool_images, pool_ids, t1 - t0, t2 - t1, t3 - t2, candidates, sample, labels)


def imageset_sha256(imageset: ImageSet) -> str:
    """Content hash of a dataset: ids, labels and file bytes, in id order."""
    h = hashlib.sha256()
    order = sorted(range(len(imageset)), key=lambda i: imageset.ids[i])
    for i in order:
        h.update(imageset.ids[i].encode())
        if imageset.labels is not None and imageset.classes is not None:
            h.update(imageset.classes[imageset.labels[i]].encode())
        h.update(hashlib.sha256(Path(imageset.paths[i]).read_bytes()).digest())
    return h.hexdigest()


@dataclass
class AdaptOutcome:
    result: AdaptResult
    lineage: Lineage
    before: dict[str, object] | None = None
    after: dict[str, object] | None = None
    retrieval_seconds: dict[str, float] = field(default_factory=dict)
    # a sample of what retrieval did: [{"target": target id, "neighbours": [{"id", "score"}]}] (Retrieved.sample)
    neighbour_sample: list[dict[str, Any]] = field(default_factory=list)
    # the neighbours that served as labelled training data, by pool id (labelled neighbours as data)
    labelled_neighbours: list[LabelledUse] = field(default_factory=list)
    # wall seconds of run_adaptation's parts (PIPELINE_PHASES), for a job's phase table; not in the checkpoint
    phase_seconds: dict[str, float] = field(default_factory=dict)
    # how good the neighbours were (NeighbourQuality.as_dict; t3ar.retrieval_ranking.retrieval_quality); None
    # without retrieval
    neighbour_quality: dict[str, Any] | None = None

    def checkpoint_metrics(self) -> dict[str, Any]:
        """The ``metrics`` an adapted checkpoint stores: the same keys and rounding whoever made it (the CLI's
        ``t3ar adapt`` or a worker)."""
        res = self.result
        out: dict[str, Any] = {"steps": res.steps, "epochs": res.epochs, "seconds_adapt": round(res.seconds, 3),
                               "seconds_per_epoch": round(res.seconds_per_epoch, 3),
                               "retrieval_seconds": dict(self.retrieval_seconds)}
        if res.collapse_step is not None:  # the collapse watch reset the model to the bn-adapt state
            out["collapse_fallback_step"] = res.collapse_step
        if self.before is not None and self.after is not None:
            out["before"], out["after"] = self.before, self.after
        return out


#: the keys of AdaptOutcome.phase_seconds: target decoded, evaluation (before + after), target embedded, pool
#: searched, neighbour images fetched, bank initialised (adapt()'s set-up before its first step), steps, lineage
PIPELINE_PHASES = ("target_decoded", "evaluation", "target_embedded", "pool_searched", "neighbours_fetched",
                   "bank_initialised", "steps", "lineage")


def labels_for_model(imageset: ImageSet, model_classes: Sequence[str]) -> torch.Tensor:
    """The dataset's labels as indices into the model's class list (DatasetError on unknown classes)."""
    if imageset.labels is None or imageset.classes is None:
        raise DatasetError("this dataset has no labels")
    mapping = class_map_check(list(imageset.classes), list(model_classes))
    return torch.tensor([mapping[y] for y in imageset.labels], dtype=torch.long)


def run_adaptation(
    model: Classifier,
    info: CheckpointInfo,
    target: ImageSet,
    config: AdaptConfig,
    *,
    provider: NeighbourProvider | None,
    device: torch.device,
    eval_set: ImageSet | None = None,
    on_step: Callable[[StepStats], None] | None = None,
    target_tensor: torch.Tensor | None = None,
    rows: Sequence[int] | None = None,
    quality_holdout: tuple[torch.Tensor, torch.Tensor] | None = None,
    probe: Probe | None = None,
) -> AdaptOutcome:
    """Subsample T (``config.fraction``; ``rows``: the subsample drawn already, e.g. recorded with a job), retrieve,
    adapt ``model`` in place, evaluate before/after.

    Evaluation uses ``eval_set`` when given (held-out images), else the whole of ``target`` when it is
    labelled (the usual transductive test-time protocol), else none. ``quality_holdout`` (uint8 images, labels
    as model class indices): the holdout the neighbour quality's precision@k is measured on (else a labelled
    target's own labels). ``probe``: the benchmarks' research hook (:class:`~t3ar.method.probe.Probe`), handed to
    retrieval and :func:`~t3ar.method.adapt.adapt`; the product never sets it.
    """
    spec = info.spec
    t_start = time.perf_counter()
    gen = seed_everything(config.seed)
    if config.mode == "train" and not target.labelled:
        raise DatasetError("train-time mode needs a labelled target (class folders or labels.csv)")
    full = target_tensor if target_tensor is not None else load_tensors(target, spec.image_size)
    keep = list(rows) if rows is not None else adapted_rows(target.labels, len(target), config.fraction,
                                                            config.seed, mode=config.mode)
    adapt_set, x = target.subset(keep), full[keep]
    labels = labels_for_model(adapt_set, spec.classes) if config.mode == "train" else None

    ev = eval_set if eval_set is not None else (target if target.labelled else None)
    norm = Normalizer(spec.backbone.mean, spec.backbone.std, device)
    ev_x = ev_y = None
    if ev is not None:
        ev_x = full if ev is target else load_tensors(ev, spec.image_size)
        ev_y = labels_for_model(ev, spec.classes)
    model.to(device)
    t_eval = time.perf_counter()
    before = evaluate(model, ev_x, ev_y, spec.classes, norm) if ev_x is not None and ev_y is not None else None
    seconds_eval = time.perf_counter() - t_eval
    seconds_decode = t_eval - t_start

    retrieved: Retrieved | None = None
    context: RankContext | None = None
    if config.uses_retrieval:
        if provider is None:
            raise InvalidInputError(f"method {config.method} needs a pool (retriever)")
        context = RankContext.for_job(model, x, config, spec, device)
        retrieved = retrieve(provider, x, config, spec.image_size, gen, context=context, probe=probe)
    sources = None
    if retrieved is not None and provider is not None and config.pool_use().sources is not None:
        sources = provider.sources(retrieved.pool_ids)  # which neighbours may serve as data
    known = pool_classes(retrieved.pool_labels, spec.classes) if (retrieved and retrieved.pool_labels) else None
    # the base model, kept for the neighbour quality's pseudo-labels when no ranking option already holds its view
    base_for_quality = (copy.deepcopy(model) if retrieved is not None and provider is not None and context is None
                        and any(provider.labels(retrieved.pool_ids)) else None)
    t_adapt = time.perf_counter()
    result = adapt(model, x, config, mean=spec.backbone.mean, std=spec.backbone.std, labels=labels,
                   neighbours=retrieved.neighbours if retrieved else None,
                   pool_images=retrieved.pool_images if retrieved else None,
                   candidates=retrieved.candidates if retrieved else None,
                   device=device, generator=gen, on_step=on_step, pool_sources=sources, pool_labels=known,
                   probe=probe)
    t_eval = time.perf_counter()
    seconds_adapt_call = t_eval - t_adapt
    after = evaluate(model, ev_x, ev_y, spec.classes, norm) if ev_x is not None and ev_y is not None else None
    t_lineage = time.perf_counter()
    seconds_eval += t_lineage - t_eval
    used = [retrieved.pool_ids[i] for i in result.pool_used] if retrieved else []
    lineage = Lineage(
        base_model_sha256=info.sha256, target_sha256=imageset_sha256(adapt_set), target_size=len(adapt_set),
        pool_ids=tuple(sorted(used)), retriever=provider.identity if (provider and retrieved) else None,
        method=config.method,
    )
    secs = {"embed": retrieved.seconds_embed, "search": retrieved.seconds_search,
            "fetch": retrieved.seconds_fetch} if retrieved else {}
    sample = [{"target": adapt_set.ids[i], "neighbours": [{"id": pid, "score": None if sc is None else round(sc, 4)}
                                                          for pid, sc in row]}
              for i, row in (retrieved.sample if retrieved else [])]
    served = [LabelledUse(retrieved.pool_ids[i], str(retrieved.pool_labels[i]), uses)
              for i, uses in sorted(result.pool_labelled.items())] if retrieved else []
    phases = {"target_decoded": seconds_decode, "evaluation": seconds_eval,
              "target_embedded": secs.get("embed", 0.0), "pool_searched": secs.get("search", 0.0),
              "neighbours_fetched": secs.get("fetch", 0.0),
              # adapt()'s steps are result.seconds; the rest of the call is its set-up (the bank, the optimiser)
              "bank_initialised": max(0.0, seconds_adapt_call - result.seconds), "steps": result.seconds,
              "lineage": time.perf_counter() - t_lineage}
    quality = (retrieval_quality(provider, retrieved.neighbours, retrieved.pool_ids, x, config, spec, device,
                                 model_before=base_for_quality, context=context,
                                 target_labels=labels_for_model(adapt_set, spec.classes) if adapt_set.labelled
                                 else None, holdout=quality_holdout)
               if retrieved is not None and provider is not None else None)
    return AdaptOutcome(result, lineage, before, after, secs, sample, served, phases, quality)


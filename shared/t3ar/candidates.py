"""A job with a holdout: every candidate adapts from the base model, is scored on the holdout, and the winner's
weights are the job's (:mod:`t3ar.acceptance` decides). The I/O edge around it, like :mod:`t3ar.pipeline`: used
by ``t3ar adapt --holdout`` and the worker alike.

The candidates share what does not depend on the method: the target is decoded once, the holdout once, and the
retrieval (the target's embedding, the pool search, the neighbour images) is asked of the pool once
(:class:`SharedProvider` remembers the answers); each candidate starts from the base weights with the job's seed,
so a retrieval candidate draws the same neighbours as the requested method.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image

from t3ar.acceptance import Acceptance, as_record, decide
from t3ar.acceptance_options import AcceptanceOptions, candidate_config, candidate_names
from t3ar.clients.job_report import AcceptanceRecord
from t3ar.data.datasets import ImageSet, load_tensors
from t3ar.data.holdout import Holdout, check_holdout, image_digests
from t3ar.errors import InvalidInputError
from t3ar.method.adapt import StepStats
from t3ar.method.augment import Normalizer
from t3ar.method.config import AdaptConfig
from t3ar.method.evaluate import predict
from t3ar.method.retrieval import NeighbourProvider
from t3ar.models.checkpoint import CheckpointInfo
from t3ar.models.classifier import Classifier
from t3ar.pipeline import AdaptOutcome, labels_for_model, run_adaptation
from t3ar.retrieval_ranking import LabelSearch

log = logging.getLogger(__name__)


def _digest(array: np.ndarray | torch.Tensor) -> str:
    a = array.numpy() if isinstance(array, torch.Tensor) else np.ascontiguousarray(array)
    return hashlib.sha256(a.tobytes()).hexdigest() + str(a.shape)


class SharedProvider:
    """A :class:`~t3ar.method.retrieval.NeighbourProvider` that asks its pool each question once: the same
    images embedded, the same queries searched and the same ids fetched are answered from memory afterwards."""

    def __init__(self, inner: NeighbourProvider) -> None:
        self.inner = inner
        self._embedded: dict[str, np.ndarray] = {}
        self._searched: dict[tuple[str, int], tuple[np.ndarray, list[list[str]]]] = {}
        self._labelled: dict[tuple[str, int], tuple[np.ndarray, list[list[str]]]] = {}
        self._images: dict[str, Image.Image] = {}
        self._all: list[str] | None = None
        self._size: int | None = None

    @property
    def identity(self) -> str:
        return self.inner.identity

    def size(self) -> int:
        if self._size is None:
            self._size = self.inner.size()
        return self._size

    def embed(self, images: torch.Tensor) -> np.ndarray:
        key = _digest(images.cpu())
        if key not in self._embedded:
            self._embedded[key] = self.inner.embed(images)
        return self._embedded[key]

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        key = (_digest(queries), k)
        if key not in self._searched:
            self._searched[key] = self.inner.search(queries, k)
        return self._searched[key]

    def search_label(self, queries: np.ndarray, k: int, label: str | None) -> tuple[np.ndarray, list[list[str]]]:
        """The inner provider's label-filtered search (class-conditional retrieval), answered once per question."""
        if not isinstance(self.inner, LabelSearch):
            raise InvalidInputError("this pool cannot search by label: class-conditional retrieval needs a "
                                    "retriever that answers label-filtered searches")
        key = (f"{_digest(queries)}:{label}", k)
        if key not in self._labelled:
            self._labelled[key] = self.inner.search_label(queries, k, label)
        return self._labelled[key]

    def all_ids(self) -> list[str]:
        if self._all is None:
            self._all = self.inner.all_ids()
        return list(self._all)

    def fetch(self, ids: Sequence[str]) -> list[Image.Image]:
        missing = [i for i in dict.fromkeys(ids) if i not in self._images]
        if missing:
            self._images.update(zip(missing, self.inner.fetch(missing), strict=True))
        return [self._images[i] for i in ids]

    def sources(self, ids: Sequence[str]) -> list[str]:
        return self.inner.sources(ids)

    def labels(self, ids: Sequence[str]) -> list[str | None]:
        return self.inner.labels(ids)


@dataclass
class CandidateRun:
    """One candidate: its config, its run (losses, lineage), its correctness on the holdout, its wall seconds
    (adaptation and holdout evaluation) and its weights (on the CPU)."""

    name: str
    config: AdaptConfig
    outcome: AdaptOutcome
    correct: np.ndarray
    seconds: float
    state: dict[str, torch.Tensor] = field(repr=False, default_factory=dict)


@dataclass
class CandidatesOutcome:
    acceptance: Acceptance
    runs: dict[str, CandidateRun]
    holdout_size: int
    seconds_holdout_decoded: float = 0.0
    holdout_classes: int | None = None  # classes with images in the holdout

    @property
    def winner(self) -> CandidateRun:
        return self.runs[self.acceptance.winner]

    def record(self, *, require_gain: bool = False) -> AcceptanceRecord:
        """The acceptance record (what the report, ``GET /jobs/{id}`` and the checkpoint's metadata carry)."""
        return as_record(self.acceptance, require_gain=require_gain,
                         seconds={name: run.seconds for name, run in self.runs.items()},
                         methods={name: run.config.method for name, run in self.runs.items()},
                         classes=self.holdout_classes,
                         pool_use={name: {"pool_ids_used": len(run.outcome.lineage.pool_ids),
                                          "labelled_neighbours_total": len(run.outcome.labelled_neighbours),
                                          "neighbour_quality": run.outcome.neighbour_quality}
                                   for name, run in self.runs.items()})

    def phase_seconds(self) -> dict[str, float]:
        """The candidates' pipeline phases added up (the worker's phase table), the holdout's decoding and
        scoring under ``evaluation``."""
        total: dict[str, float] = {}
        for run in self.runs.values():
            for k, v in run.outcome.phase_seconds.items():
                total[k] = total.get(k, 0.0) + v
            rest = run.seconds - sum(run.outcome.phase_seconds.values())
            total["evaluation"] = total.get("evaluation", 0.0) + max(0.0, rest)
        total["target_decoded"] = total.get("target_decoded", 0.0) + self.seconds_holdout_decoded
        return total


def run_candidates(
    model: Classifier,
    info: CheckpointInfo,
    target: ImageSet,
    config: AdaptConfig,
    options: AcceptanceOptions,
    holdout: Holdout,
    *,
    provider: NeighbourProvider | None,
    device: torch.device,
    on_step: Callable[[StepStats], None] | None = None,
    on_candidate: Callable[[str, int, int], None] | None = None,
    target_tensor: torch.Tensor | None = None,
    rows: Sequence[int] | None = None,
    eval_set: ImageSet | None = None,
    max_holdout: int | None = None,
) -> CandidatesOutcome:
    """Adapt each candidate from ``model``'s weights, score it on ``holdout``, decide, and leave ``model`` holding
    the winner's weights (each candidate's before/after accuracy on ``eval_set`` as :func:`run_adaptation` gives
    it). ``on_step`` follows the job's own method only; ``on_candidate(name, i, n)`` is called
    as each candidate starts. The holdout is checked first (:func:`~t3ar.data.holdout.check_holdout`: the model's
    classes, no empty class, no image of the target; at most ``max_holdout`` images when given)."""
    spec = info.spec
    check_holdout(holdout, spec.classes, target_digests=image_digests(target),
                  max_images=max_holdout if max_holdout is not None else len(holdout))
    t = time.perf_counter()
    full = target_tensor if target_tensor is not None else load_tensors(target, spec.image_size)
    hx = load_tensors(holdout.images, spec.image_size)
    hy = labels_for_model(holdout.images, spec.classes)
    decoded = time.perf_counter() - t
    norm = Normalizer(spec.backbone.mean, spec.backbone.std, device)
    model.to(device)
    base = {k: v.detach().clone() for k, v in model.state_dict().items()}
    shared = SharedProvider(provider) if provider is not None else None
    names = candidate_names(options, config)
    runs: dict[str, CandidateRun] = {}
    for i, name in enumerate(names):
        if on_candidate is not None:
            on_candidate(name, i, len(names))
        cfg = candidate_config(config, name)
        model.load_state_dict(base)
        t = time.perf_counter()
        out = run_adaptation(model, info, target, cfg, provider=shared if cfg.uses_retrieval else None,
                             device=device, target_tensor=full, eval_set=eval_set, rows=rows,
                             on_step=on_step if name == config.method else None, quality_holdout=(hx, hy))
        correct = (predict(model, hx, norm).argmax(1) == hy).numpy()
        seconds = time.perf_counter() - t
        runs[name] = CandidateRun(name, cfg, out, correct, seconds,
                                  {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()})
        log.info("candidate %s: %d/%d right on the holdout (%.1f s)", name, int(correct.sum()), len(correct), seconds)
    acceptance = decide({n: r.correct for n, r in runs.items()}, options.rule, seed=config.seed)
    model.load_state_dict(runs[acceptance.winner].state)
    log.info("acceptance (%s): %s wins: %s", acceptance.rule, acceptance.winner, acceptance.reason)
    return CandidatesOutcome(acceptance, runs, len(holdout), decoded, len(set(hy.tolist())))

"""A retrieval job's neighbour quality (t3ar.retrieval_ranking.retrieval_quality) on the tiny model and an
in-memory pool: pseudo-label agreement, precision on a labelled target or on a holdout, the source mix; and the
report's record and text read it back."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
import torch
from PIL import Image
from tiny_models import tiny_problem

from t3ar.clients.job_report import NeighbourQualityRecord, quality_lines
from t3ar.method.config import AdaptConfig
from t3ar.models.backbones import BackboneSpec
from t3ar.models.classifier import ModelSpec
from t3ar.retrieval_ranking import BaseView, RankContext, retrieval_quality

CLASSES = ("a", "b", "c")
SPEC = ModelSpec(backbone=BackboneSpec(weights="none"), classes=CLASSES, image_size=16, bottleneck_dim=8)


class MemoryPool:
    """9 pool items p0..p8: labels a, b, c, a, b, c, None, None, None; sources by thirds; embed = mean colour."""

    def __init__(self, images: torch.Tensor) -> None:
        self.images = images
        self.ids = [f"p{i}" for i in range(len(images))]
        self.vecs = self.embed(images)
        self._labels: list[str | None] = [*CLASSES, *CLASSES, None, None, None]

    identity = "memory"

    def size(self) -> int:
        return len(self.ids)

    def embed(self, images: torch.Tensor) -> np.ndarray:
        v = images.float().mean(dim=(2, 3)).numpy() - 127.5
        return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        sims = queries @ self.vecs.T
        order = np.argsort(-sims, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(sims, order, 1), [[self.ids[j] for j in row] for row in order]

    def all_ids(self) -> list[str]:
        return list(self.ids)

    def fetch(self, ids: Sequence[str]) -> list[Image.Image]:
        return [Image.fromarray(self.images[self.ids.index(i)].permute(1, 2, 0).numpy()) for i in ids]

    def sources(self, ids: Sequence[str]) -> list[str]:
        return [("s1", "s2", "s3")[self.ids.index(i) // 3] for i in ids]

    def labels(self, ids: Sequence[str]) -> list[str | None]:
        return [self._labels[self.ids.index(i)] for i in ids]


def _setup() -> tuple[MemoryPool, torch.Tensor, AdaptConfig, torch.nn.Module]:
    model, target, pool_images, _ = tiny_problem(n_target=6, n_pool=9, seed=3)
    config = AdaptConfig.model_validate({"method": "t3ar", "retrieval": {"k": 2, "r": 2}})
    return MemoryPool(pool_images), target, config, model


def test_quality_counts_pseudo_label_agreement_truth_and_sources() -> None:
    pool, target, config, model = _setup()
    neighbours = torch.tensor([[0, 6], [1, 2], [3, -1], [4, 5], [7, 8], [0, 1]])
    pool_ids = pool.ids
    truth = torch.tensor([0, 1, 0, 2, 1, 2])
    q = retrieval_quality(pool, neighbours, pool_ids, target, config, SPEC, torch.device("cpu"),
                          model_before=model, context=None, target_labels=truth)
    view = BaseView(model, target, mean=SPEC.backbone.mean, std=SPEC.backbone.std, device=torch.device("cpu"),
                    train_groups=config.train_groups, batch_size=config.batch_size, seed=config.seed)
    pseudo = view.features_logits(target)[1].argmax(1)
    classes = {0: 0, 1: 1, 2: 2, 3: 0, 4: 1, 5: 2}
    labelled = [(i, classes[int(j)]) for i, row in enumerate(neighbours.tolist()) for j in row if j in classes]
    assert q["pseudo_label_agreement"]["labelled"] == len(labelled) == 8  # type: ignore[index]
    assert q["pseudo_label_agreement"]["matches"] == sum(c == int(pseudo[i]) for i, c in labelled)  # type: ignore[index]
    # true labels: row 0 (a: p0 yes), row 1 (b: p1 yes, p2 no), row 2 (a: p3 yes), row 3 (c: p4 no, p5 yes),
    # row 4 (nothing labelled), row 5 (c: p0 no, p1 no)
    assert q["precision_at_k"] == {"share": 0.5, "matches": 4, "labelled": 8, "queries": 6}
    assert q["precision_on"] == "target" and q["hit_rate"] == pytest.approx(4 / 6, abs=1e-4)
    assert q["sources"] == {"s1": 5, "s2": 3, "s3": 3} and q["neighbours"] == 11 and q["ranking"] == "index"
    record = NeighbourQualityRecord.model_validate(q)
    text = "\n".join(quality_lines(record))
    assert "precision@2 on the target's true labels 50.0 % (4 of 8 labelled neighbours of 6 images)" in text
    assert "neighbours by pool source: s1 5, s2 3, s3 3" in text


def test_a_holdout_is_searched_and_ranked_like_the_target() -> None:
    pool, target, config, model = _setup()
    context = RankContext.for_job(model, target, config, SPEC, torch.device("cpu"), always=True)
    assert context is not None
    hx, hy = pool.images[:3], torch.tensor([0, 1, 2])  # the holdout: the pool's own labelled images a, b, c
    q = retrieval_quality(pool, torch.tensor([[0, 1]]), pool.ids, target[:1], config, SPEC, torch.device("cpu"),
                          model_before=None, context=context, holdout=(hx, hy))
    # each holdout image's nearest item by R is itself (its own class): at least 3 matches among its first 2
    assert q["precision_on"] == "holdout" and q["precision_at_k"]["matches"] >= 3  # type: ignore[index]
    assert q["hit_rate"] == 1.0


def test_without_labelled_neighbours_or_a_model_only_sources_are_measured() -> None:
    pool, target, config, _ = _setup()
    q = retrieval_quality(pool, torch.tensor([[6, 7]]), pool.ids, target[:1], config, SPEC, torch.device("cpu"),
                          model_before=None, context=None)
    assert q["pseudo_label_agreement"] is None and q["precision_at_k"] is None and q["sources"] == {"s3": 2}

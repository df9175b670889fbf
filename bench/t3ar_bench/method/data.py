"""Data of the adaptation benchmark: the data kits, target styles as tensors, pool components and their
embeddings (computed once per retriever, cached on disk), the in-process pool the runs retrieve from, and
the per-seed source models (cached on disk, so re-runs skip training).
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from t3ar.data.datasets import load_tensors, read_labelled, read_unlabelled
from t3ar.data.images import open_image
from t3ar.datakit.archive import build_archive
from t3ar.datakit.emoji import DEFAULT_STYLES, build_emoji
from t3ar.datakit.pool import build_pool
from t3ar.embedder import Embedder
from t3ar.local_pool import LocalPool
from t3ar.method.supervised import TrainConfig, train_supervised
from t3ar.models.backbones import PRESETS
from t3ar.models.checkpoint import Lineage, load_checkpoint, save_checkpoint
from t3ar.models.classifier import Classifier, ModelSpec, build_classifier

log = logging.getLogger(__name__)

KIT_SIZE = 64
POOL_SOURCES: tuple[str, ...] = ("openclipart", "tuxpaint")


def _sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


@dataclass
class Kits:
    emoji: Path
    pool: Path
    emoji_request: dict[str, Any]
    seconds: float
    archive: Path | None = None  # the labelled emoji archive (``work/archive``), when asked for


def build_kits(work: Path, cache: Path, archive_styles: Sequence[str] = ()) -> Kits:
    """Build (or reuse) the emoji kit (5 styles, subcategory labels) and the clipart pool kit under ``work``, and
    the labelled emoji archive of ``archive_styles`` (labelled with the kit's classes) when any are given."""
    t0 = time.perf_counter()
    bars = sys.stderr.isatty()
    emoji = build_emoji(work / "emoji", cache=cache, styles=DEFAULT_STYLES, label="subcategory", size=KIT_SIZE,
                        progress=bars)
    pool = build_pool(work / "pool", cache=cache, sources=POOL_SOURCES, size=KIT_SIZE, progress=bars)
    log.info("data kits: %d emoji x %d styles, %d classes; pool %d images", emoji.n_emoji, len(emoji.styles),
             emoji.n_classes, pool.total)
    request = json.loads((work / "emoji" / "manifest.json").read_text())["request"]
    archive = None
    if archive_styles:
        archive = work / "archive"
        build_archive(archive, cache=cache, styles=archive_styles, classes=emoji.classes, label="subcategory",
                      size=KIT_SIZE, progress=bars)
    return Kits(work / "emoji", work / "pool", request, time.perf_counter() - t0, archive)


@dataclass
class StyleSet:
    """One emoji style as uint8 tensors at the model's input size, with subcategory labels and emoji codes."""

    style: str
    images: torch.Tensor  # [N, 3, S, S] uint8
    labels: torch.Tensor  # [N] long, indices into ``classes``
    classes: list[str]
    items: list[str]  # emoji code per image (the same code names the same emoji in every style)

    def label_names(self, idx: Sequence[int]) -> list[str]:
        return [self.classes[int(self.labels[i])] for i in idx]


def load_style(emoji_dir: Path, style: str, size: int, classes: Sequence[str] | None = None) -> StyleSet:
    """One style's class folders under ``emoji_dir`` as tensors. With ``classes`` (the task's class list, e.g. the
    source style's) the labels index into it, so a style that lacks some classes (an archive style) is a target
    of the same task; RuntimeError when a folder's class is not one of them. Without, the style's own folders."""
    ds = read_labelled(emoji_dir / style)
    assert ds.labels is not None and ds.classes is not None
    names, labels = list(ds.classes), list(ds.labels)
    if classes is not None:
        index = {c: i for i, c in enumerate(classes)}
        unknown = sorted(set(names) - set(index))
        if unknown:
            raise RuntimeError(f"{style}: classes {unknown[:5]} are not the task's")
        labels = [index[names[y]] for y in labels]
        names = list(classes)
    return StyleSet(style, load_tensors(ds, size), torch.tensor(labels, dtype=torch.long), names,
                    [Path(i).stem for i in ds.ids])


@dataclass
class Component:
    """One source of pool images. Ids are ``<name>/<file stem>``; emoji components (kit and archive styles) know
    their labels; a component's name is its style's (:func:`t3ar.datakit.archive.family_of` gives its family)."""

    name: str
    ids: list[str]
    paths: list[Path]
    labels: list[str] | None = None  # subcategory per item (emoji styles only): the diagnostics' side table
    items: list[str] | None = None  # emoji code per item


def pool_components(kits: Kits, styles: Sequence[str], cap: int | None, seed: int = 0,
                    archive_styles: Sequence[str] = ()) -> dict[str, Component]:
    """The clipart sources (unlabelled), the given emoji kit styles and the given archive styles (labelled: their
    folder names) as pool components, each capped to ``cap`` items. Which of them enter a shift's pool is
    :func:`t3ar_bench.method.labelled_pool.pool_names`' choice. Archive styles need ``kits.archive``."""
    if archive_styles and kits.archive is None:
        raise ValueError("archive styles asked for, but the kits were built without the archive")
    out: dict[str, Component] = {}
    for name in POOL_SOURCES:
        ds = read_unlabelled(kits.pool / name)
        out[name] = Component(name, [f"{name}/{Path(i).stem}" for i in ds.ids], list(ds.paths))
    folders = [(s, kits.emoji / s) for s in styles] + [(s, kits.archive / s) for s in archive_styles if kits.archive]
    for style, folder in folders:
        if style in out:
            raise ValueError(f"pool component {style!r} given twice")
        ds = read_labelled(folder)
        assert ds.labels is not None and ds.classes is not None
        codes = [Path(i).stem for i in ds.ids]
        out[style] = Component(style, [f"{style}/{c}" for c in codes], list(ds.paths),
                               [ds.classes[y] for y in ds.labels], codes)
    if cap is not None:
        for name, c in out.items():
            if len(c.ids) > cap:
                keep = sorted(random.Random(f"pool:{seed}:{name}").sample(range(len(c.ids)), cap))
                out[name] = Component(name, [c.ids[i] for i in keep], [c.paths[i] for i in keep],
                                      [c.labels[i] for i in keep] if c.labels else None,
                                      [c.items[i] for i in keep] if c.items else None)
    return out


def side_table(components: Sequence[Component]) -> dict[str, tuple[str, str]]:
    """pool id -> (subcategory, emoji code) for the pool items whose label is known."""
    return {pid: (lab, item) for c in components if c.labels and c.items
            for pid, lab, item in zip(c.ids, c.labels, c.items, strict=True)}


def content_key(image: torch.Tensor) -> bytes:
    """A uint8 image's identity by content (how a known target image finds its precomputed query vector)."""
    return hashlib.blake2b(image.contiguous().numpy().tobytes(), digest_size=16).digest()


class EmbeddingStore:
    """Embeddings by one retriever R, per pool component and per target style, cached as .npy files."""

    def __init__(self, embedder: Embedder, tag: str, cache_dir: Path) -> None:
        self.embedder = embedder
        self.tag = tag  # identity of R, plus anything its identity does not capture (random-init seed)
        self.cache_dir = cache_dir
        self.seconds = 0.0  # spent embedding (cache misses only)
        self.embedded = 0  # images embedded (cache misses only)
        self.seconds_reused = 0.0  # what the reused (cached) embeddings cost when they were computed
        self._memo: dict[str, np.ndarray] = {}

    def _cached(self, what: str, key: Any, compute: Any) -> np.ndarray:
        name = f"{_sha(self.tag)[:12]}-{what}-{_sha(key)[:12]}.npy"
        if name in self._memo:
            return self._memo[name]
        path = self.cache_dir / name
        cost = path.with_suffix(".seconds")
        if path.is_file():
            vecs = np.load(path)
            self.seconds_reused += float(cost.read_text()) if cost.is_file() else 0.0
        else:
            t0 = time.perf_counter()
            vecs = compute()
            took = time.perf_counter() - t0
            self.seconds += took
            self.embedded += len(vecs)
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp.npy")
            np.save(tmp, vecs)
            tmp.replace(path)
            cost.write_text(f"{took:.3f}\n")
        self._memo[name] = vecs
        return vecs

    def component(self, c: Component, batch_size: int = 128) -> np.ndarray:
        def compute() -> np.ndarray:
            chunks = [self.embedder.embed([open_image(p) for p in c.paths[i:i + batch_size]], batch_size)
                      for i in range(0, len(c.paths), batch_size)]
            log.info("embedded pool component %s (%d images) with %s", c.name, len(c.paths), self.tag)
            return np.concatenate(chunks) if chunks else np.empty((0, self.embedder.dim), np.float32)

        return self._cached(c.name, c.ids, compute)

    def queries(self, target: StyleSet, idx: Sequence[int]) -> dict[bytes, np.ndarray]:
        """Query vectors of target images (the tensor path LocalPool.embed uses), keyed by image content."""
        x = target.images[list(idx)]
        vecs = self._cached(f"queries-{target.style}", [target.style, list(target.images.shape),
                                                       [target.items[i] for i in idx]],
                            lambda: self.embedder.embed(x))
        return {content_key(img): v for img, v in zip(x, vecs, strict=True)}


class BenchPool(LocalPool):
    """A :class:`LocalPool` over precomputed vectors. Query embeddings of known target images are looked up
    (identical to computing them: same R, same tensor path); decoded pool images are shared between runs."""

    def __init__(self, embedder: Embedder, components: Sequence[Component], vectors: Sequence[np.ndarray],
                 known_queries: Mapping[bytes, np.ndarray], image_cache: dict[str, Image.Image]) -> None:
        ids = [i for c in components for i in c.ids]
        paths = [p for c in components for p in c.paths]
        super().__init__(embedder, paths, ids, np.concatenate(list(vectors)))
        self.components = [c.name for c in components]
        # the emoji components' labels, for class-conditional retrieval's label-filtered search only (the method
        # reads pool labels from the side table, as the runs always did)
        self._search_labels: list[str | None] = []
        for c in components:
            self._search_labels += c.labels if c.labels is not None else [None] * len(c.ids)
        self._known = known_queries
        self._images = image_cache
        self._path_of = dict(zip(ids, paths, strict=True))

    def embed(self, images: torch.Tensor) -> np.ndarray:
        found = [self._known.get(content_key(img)) for img in images]
        if all(v is not None for v in found):
            return np.stack([v for v in found if v is not None]) if found else \
                np.empty((0, self.embedder.dim), np.float32)
        return self.embedder.embed(images)

    def search_label(self, queries: np.ndarray, k: int, label: str | None) -> tuple[np.ndarray, list[list[str]]]:
        """LocalPool's exact label-filtered search over the components' labels (class-conditional retrieval)."""
        if label is None:
            return self.search(queries, k)
        saved, self._labels = self._labels, self._search_labels
        try:
            return super().search_label(queries, k, label)
        finally:
            self._labels = saved

    def clear_image_cache(self) -> None:
        """Forget decoded pool images (so that a timed fetch really decodes)."""
        self._images.clear()

    def fetch(self, ids: Sequence[str]) -> list[Image.Image]:
        out = []
        for pid in ids:
            img = self._images.get(pid)
            if img is None:
                img = self._images[pid] = open_image(self._path_of[pid])
            out.append(img)
        return out


@dataclass
class SourceModel:
    model: Classifier
    spec: ModelSpec
    sha256: str
    metrics: dict[str, Any]
    reused: bool


def source_model(work: Path, source: StyleSet, config: TrainConfig, image_size: int, kit_request: Mapping[str, Any],
                 device: torch.device) -> SourceModel:
    """Train f_S on the whole source style (or load it from the cache under ``work/models``)."""
    from t3ar.device import seed_everything

    spec = ModelSpec(backbone=PRESETS["efficientnet_lite0"], classes=tuple(source.classes), image_size=image_size)
    # views_ahead changes when views are made, never the model (tested): not part of the key
    key = _sha({"train": config.model_dump(exclude={"views_ahead"}), "spec": spec.model_dump(mode="json"),
                "kit": kit_request})
    path = work / "models" / f"source-{key[:16]}-seed{config.seed}.pt"
    if path.is_file():
        model, info = load_checkpoint(path, device=device)
        log.info("source model for seed %d reused from %s", config.seed, path)
        return SourceModel(model, info.spec, info.sha256, info.metrics, True)
    gen = seed_everything(config.seed)
    model = build_classifier(spec).to(device)
    res = train_supervised(model, source.images, source.labels, config, mean=spec.backbone.mean,
                           std=spec.backbone.std, device=device, generator=gen)
    metrics = {"seconds": res.seconds, "steps": res.steps, "train_size": len(source.images),
               "train_config": config.model_dump()}
    sha = save_checkpoint(path, model, spec, lineage=Lineage(method="source"), metrics=metrics)
    log.info("source model for seed %d trained in %.0f s -> %s", config.seed, res.seconds, path)
    return SourceModel(model, spec, sha, metrics, False)

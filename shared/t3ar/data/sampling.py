"""Label bookkeeping for datasets: mapping dataset classes onto a model's, seeded stratified subsamples, and the
rows of a target an adaptation uses (:func:`adapted_rows`).

Both are re-exported by :mod:`t3ar.data.datasets`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from t3ar.errors import DatasetError, InvalidInputError


def class_map_check(classes_found: list[str], model_classes: list[str]) -> list[int]:
    """Model class index of each dataset class (``out[i]`` is the model index of ``classes_found[i]``).

    Raises DatasetError naming every dataset class the model does not know.
    """
    index: dict[str, int] = {}
    for k, name in enumerate(model_classes):
        index.setdefault(name, k)
    unknown = [c for c in classes_found if c not in index]
    if unknown:
        shown = ", ".join(model_classes[:10]) + (", ..." if len(model_classes) > 10 else "")
        raise DatasetError(
            f"dataset classes not known to the model: {', '.join(unknown)}; the model has "
            f"{len(model_classes)} classes ({shown}): rename or drop those folders/rows"
        )
    return [index[c] for c in classes_found]


def stratified_subsample(labels: Sequence[int] | None, n_items: int, fraction: float, seed: int) -> list[int]:
    """Sorted indices of a seeded subsample of ``n_items`` items; deterministic for a given seed.

    With labels: ``round(fraction * count)`` per class but at least one per non-empty class. Without labels:
    a uniform sample of ``max(1, round(fraction * n_items))``. ``fraction`` must be in (0, 1]; 1.0 keeps all.
    """
    if not 0.0 < fraction <= 1.0:
        raise InvalidInputError(f"fraction must be in (0, 1], got {fraction}")
    if labels is not None and len(labels) != n_items:
        raise InvalidInputError(f"got {len(labels)} labels for {n_items} items")
    if n_items <= 0:
        return []
    if fraction == 1.0:
        return list(range(n_items))
    rng = random.Random(seed)
    if labels is None:
        return sorted(rng.sample(range(n_items), max(1, round(fraction * n_items))))
    by_class: dict[int, list[int]] = {}
    for i, lab in enumerate(labels):
        by_class.setdefault(int(lab), []).append(i)
    chosen: list[int] = []
    for lab in sorted(by_class):
        members = by_class[lab]
        chosen.extend(rng.sample(members, min(len(members), max(1, round(fraction * len(members))))))
    return sorted(chosen)


def adapted_rows(labels: Sequence[int] | None, n_items: int, fraction: float, seed: int, *, mode: str) -> list[int]:
    """The rows of a target an adaptation uses: the subsample that its config's ``fraction``, ``seed`` and
    ``mode`` choose. The one definition that the pipeline, the API's validation and checkpoint check and the
    worker's memory check share. DatasetError when fewer than 2 rows remain (adaptation needs 2).

    Only a train-time job (``mode="train"``) draws per class (it trains on the labels); a test-time job draws
    as without labels whether or not the target has them, so labels that only score it never change what it
    adapts to."""
    keep = stratified_subsample(labels if mode == "train" else None, n_items, fraction, seed)
    if len(keep) < 2:
        raise DatasetError(f"fraction={fraction} of {n_items} images leaves {len(keep)}; adaptation needs at least "
                           "2: raise fraction or send more images")
    return keep

"""How big an adaptation job is before it runs: its optimiser steps and the memory its fixed tensors take.

The API refuses a job over the operator's caps at submission (``T3AR_API_MAX_JOB_STEPS``,
``T3AR_API_MAX_JOB_MEMORY_BYTES``); the worker checks the memory against what its device has free before it
starts. The memory counted is what a job holds for its whole run and grows with its config: the
memory bank (features, logits, ids, labels, flags), the target images and the retrieved pool images (uint8, on
the device), not the model or a batch's activations. No torch here: the API imports it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from t3ar.method.batches import steps_per_epoch

if TYPE_CHECKING:
    from t3ar.method.config import AdaptConfig

__all__ = ["gib", "kept_images", "memory_bytes", "planned_steps", "steps_per_epoch", "terms"]

#: the bank's feature width when the model has no bottleneck and the backbone's is not known here
UNKNOWN_FEATURE_DIM = 2048


def planned_steps(config: AdaptConfig, n: int) -> int:
    """Optimiser steps of an adaptation of ``n`` target images (after ``fraction``) with ``config``: the first
    stage's and those the method's groups of options add after it (the T3AR family's second stage), and each pass
    over the target with gradient that a group adds (the Fisher anchor's estimate) as an epoch of steps (a batch's
    forward and backward, without the optimiser)."""
    from t3ar.method.config import trained

    if not config.spec.optimises:  # source, bn-adapt (one no-gradient pass)
        return 0
    config = trained(config)
    batch = max(1, min(config.batch_size, n))
    first = int(max(config.epochs * steps_per_epoch(n, batch), config.min_steps))
    return first + config.added_steps() + config.added_passes() * steps_per_epoch(n, batch)


def kept_images(n_images: int, fraction: float) -> int:
    """About how many of ``n_images`` a job adapts to (the stratified subsample keeps ``fraction``, at least 2)."""
    return max(2, min(n_images, math.ceil(n_images * fraction)))


def memory_bytes(config: AdaptConfig, n: int, image_size: int, feature_dim: int | None, num_classes: int, *,
                 redraw_neighbours: bool = False) -> int:
    """Bytes of the job's fixed tensors (see the module) for ``n`` target images of ``image_size`` px.
    ``redraw_neighbours``: the benchmarks' probe switch (:class:`t3ar.method.probe.Probe`; never a job's): the
    images of every one of the r·k candidates are held, not only the k drawn."""
    entries = config.bank_entries
    bank = entries * ((feature_dim or UNKNOWN_FEATURE_DIM) + num_classes) * 4 + entries * 18
    image = 3 * image_size * image_size
    pool = 0
    retrieval = config.retrieval_options
    if retrieval is not None:
        pool = n * retrieval.k * (retrieval.r if redraw_neighbours else 1) * image
    return bank + n * image + pool


#: the options a refusal names, those of them the config has: what sets its steps, and what sets its memory
STEP_OPTIONS = ("epochs", "batch_size", "min_steps", "second_stage_steps", "anchor")
MEMORY_OPTIONS = ("bank_size", "k", "r")


def terms(config: AdaptConfig, options: tuple[str, ...]) -> str:
    """``'epochs=10, batch_size=32, ...'``: those of ``options`` that ``config`` has (flat names), with its values."""
    flat = config.flat()
    return ", ".join(f"{name}={flat[name]}" for name in options if name in flat)


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"

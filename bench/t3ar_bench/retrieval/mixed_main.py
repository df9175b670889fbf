"""The mixed-pool cell (issue 52, item 3): the arms on a pool that looks like a team's, run through the adaptation
benchmark's own arm runner (:func:`t3ar_bench.method.runs.run_arm`: the same source models, target splits, label
draws and caching as the grid).

Arms (one shift, seed and fraction per cell):

- ``source``, ``bn-adapt``, ``t3ar-noretrieval`` (no retrieval);
- ``t3ar`` and ``t3ar-random``: retrieval against uniform random draws, the pool's labels unused (the paper's
  claim and control);
- ``t3ar-labels``: T3AR with retrieval, its labelled neighbours as data (the product);
- ``t3ar-labels-class-conditional``: the same with class-conditional ranking (``retrieval.ranking``);
- ``t3ar-random-labels``: ``t3ar-random`` (uniform random draws from the whole pool, the paper's control), the
  labelled ones among them as data;
- ``t3ar-labels-random``: as many labelled items as retrieval gives, drawn uniformly from every labelled pool
  item (the class-matched random control: every labelled item is of the task's classes);
- ``t3ar-labels-all``: every labelled item of the model's classes in turn (the whole-pool reference);
- ``t3ar-labels-base-rerank``: ``t3ar-labels`` with the index's candidates re-ranked by the base model's features;
- ``t3ar-labels-balanced``, ``t3ar-labels-second-stage``: the recipe (item 4): the labelled term class-balanced;
  SWAT's second stage (bottleneck and head on the target alone) after the mixed fine-tune.

The grid over shifts x seeds x fractions is :mod:`t3ar_bench.retrieval.mixed_grid`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from t3ar_bench.method.data import pool_components
from t3ar_bench.method.labelled_pool import pool_names
from t3ar_bench.method.protocol import SOURCE_STYLE
from t3ar_bench.retrieval.mixed_pool import MixedPool, compose, folder_components

log = logging.getLogger(__name__)

LABELS = {"pool_labels": {"weight": 1.0}}
#: (arm label, method, label draw, options)
MIXED_ARMS: tuple[tuple[str, str, str | None, dict[str, Any]], ...] = (
    ("source", "source", None, {}),
    ("bn-adapt", "bn-adapt", None, {}),
    ("t3ar-noretrieval", "t3ar-noretrieval", None, {}),
    ("t3ar", "t3ar", None, {}),
    ("t3ar-random", "t3ar-random", None, {}),
    ("t3ar-labels", "t3ar", "retrieved", LABELS),
    ("t3ar-labels-class-conditional", "t3ar", "retrieved", {**LABELS, "retrieval": {"ranking": "class-conditional"}}),
    ("t3ar-labels-base-rerank", "t3ar", "retrieved", {**LABELS, "retrieval": {"ranking": "base-rerank"}}),
    ("t3ar-random-labels", "t3ar-random", "retrieved", LABELS),
    ("t3ar-labels-random", "t3ar", "random", LABELS),
    ("t3ar-labels-all", "t3ar", "all", LABELS),
    # item 4, the recipe: the retrieved labelled items class-balanced, and SWAT's second stage after the fine-tune
    ("t3ar-labels-balanced", "t3ar", "retrieved", {"pool_labels": {"weight": 1.0, "balance": True}}),
    ("t3ar-labels-second-stage", "t3ar", "retrieved", {**LABELS, "second_stage": {"steps": 10}}),
)


def build_mixed(kits: Any, icons: Path, shift: str, *, icon_cap: int | None, clipart_cap: int | None,
                seed: int) -> MixedPool:
    """The shift's mixed pool from the icon store, the pool kit's clipart and the kit's labelled emoji styles."""
    unrelated = folder_components(icons, cap=icon_cap, seed=seed)
    clip = pool_components(kits, [], clipart_cap, seed)
    kit_styles = [s for s in kits.emoji_request["styles"] if s != SOURCE_STYLE]
    emoji = pool_components(kits, [n for n in pool_names(shift, [], kit_styles, []) if n != SOURCE_STYLE], None,
                            seed)
    relevant = [c for n, c in emoji.items() if c.labels is not None]
    return compose([*unrelated, *clip.values()], relevant, seed=seed)

"""A pool that looks like a team's (issue 52, item 3): a large store of unrelated packaged images in which the items
relevant to a target (emoji of the task's classes, in styles outside the target's and the source's artwork
families, with their labels) are at most 5 %.

The store: every icon of the icon sets (:mod:`t3ar.datakit.icons`), the clipart and Tux Paint stamps of the pool kit
(:mod:`t3ar.datakit.pool`). The relevant items: the labelled emoji styles :func:`~t3ar_bench.method.labelled_pool.
pool_names` gives the shift, as many as keep them under the share (:func:`relevant_cap`), drawn evenly over the
styles with a seeded choice (:func:`pick_relevant`). Which items enter depends on names, counts and the seed only:
never on an evaluation image.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from t3ar_bench.method.data import Component

#: the issue's bound on the share of relevant items in a mixed pool
MAX_RELEVANT_SHARE = 0.05


def relevant_cap(n_unrelated: int, n_available: int, share: float = MAX_RELEVANT_SHARE) -> int:
    """The most relevant items a pool of ``n_unrelated`` other items can hold with relevant / total <= ``share``
    (at most ``n_available``)."""
    if not 0 < share < 1:
        raise ValueError(f"share must be in (0, 1), got {share}")
    best = math.floor(share * n_unrelated / (1 - share) + 1e-9)
    while best > 0 and best / (n_unrelated + best) > share:  # float safety
        best -= 1
    return max(0, min(n_available, best))


def pick_relevant(components: Sequence[Component], cap: int, seed: int) -> list[Component]:
    """``cap`` items of the labelled ``components``, spread evenly over them (round robin over seeded shuffles of
    each), each component's items kept in a component of the same name, with their labels."""
    orders = {c.name: random.Random(f"{seed}:{c.name}").sample(range(len(c.ids)), len(c.ids)) for c in components}
    chosen: dict[str, list[int]] = {c.name: [] for c in components}
    taken = 0
    depth = 0
    while taken < cap and any(depth < len(o) for o in orders.values()):
        for c in components:
            if taken >= cap:
                break
            if depth < len(orders[c.name]):
                chosen[c.name].append(orders[c.name][depth])
                taken += 1
        depth += 1
    out = []
    for c in components:
        idx = sorted(chosen[c.name])
        if idx:
            out.append(Component(c.name, [c.ids[i] for i in idx], [c.paths[i] for i in idx],
                                 [c.labels[i] for i in idx] if c.labels is not None else None,
                                 [c.items[i] for i in idx] if c.items is not None else None))
    return out


def folder_components(root: Path, *, cap: int | None = None, seed: int = 0) -> list[Component]:
    """Each sub-folder of ``root`` (a built icon store or pool kit) as an unlabelled component ``<folder>/<stem>``
    (``cap``: a seeded choice of at most that many per folder)."""
    out = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        paths = sorted(folder.glob("*.png"))
        if cap is not None and len(paths) > cap:
            paths = sorted(random.Random(f"{seed}:{folder.name}").sample(paths, cap))
        if paths:
            out.append(Component(folder.name, [f"{folder.name}/{p.stem}" for p in paths], paths))
    return out


@dataclass
class MixedPool:
    components: list[Component]
    unrelated: int
    relevant: int
    labelled: int

    @property
    def total(self) -> int:
        return self.unrelated + self.relevant

    def summary(self) -> dict[str, Any]:
        return {"total": self.total, "unrelated": self.unrelated, "relevant": self.relevant,
                "labelled": self.labelled, "relevant_share": round(self.relevant / max(1, self.total), 5),
                "per_component": {c.name: len(c.ids) for c in self.components}}


def compose(unrelated: Sequence[Component], relevant: Sequence[Component], *, share: float = MAX_RELEVANT_SHARE,
            seed: int = 0) -> MixedPool:
    """The mixed pool: every ``unrelated`` item (unlabelled) and as many ``relevant`` (labelled) items as keep
    their share <= ``share``. Component names must be distinct."""
    names = [c.name for c in [*unrelated, *relevant]]
    if len(set(names)) != len(names):
        raise ValueError(f"component names repeat: {names}")
    n_unrelated = sum(len(c.ids) for c in unrelated)
    cap = relevant_cap(n_unrelated, sum(len(c.ids) for c in relevant), share)
    picked = pick_relevant(relevant, cap, seed)
    n_relevant = sum(len(c.ids) for c in picked)
    labelled = sum(sum(1 for lab in (c.labels or []) if lab) for c in picked)
    return MixedPool([*unrelated, *picked], n_unrelated, n_relevant, labelled)


def per_source(pool: MixedPool) -> Mapping[str, int]:
    return {c.name: len(c.ids) for c in pool.components}

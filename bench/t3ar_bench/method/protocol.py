"""The method benchmark's data protocol: pure computations (no I/O, no training). The plans are in
:mod:`t3ar_bench.method.plans`.

* :func:`split_adapt_eval`: the fixed, stratified split of a target style into an adaptation part and a
  held-out evaluation part (the same evaluation images for every fraction, method and seed).
* :func:`fraction_subset`: the seeded, label-blind, nested subsets (1 % ⊂ 10 % ⊂ 100 %) of the adaptation part.
* :func:`retrieval_diagnostics`: how often retrieved neighbours share the query's true subcategory.
"""

from __future__ import annotations

import math
import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

SOURCE_STYLE = "google"


def split_adapt_eval(labels: Sequence[int], eval_share: float, seed: int) -> tuple[list[int], list[int]]:
    """Stratified split into (adaptation indices, evaluation indices), both sorted.

    Per class of n items, ``round(eval_share * n)`` go to evaluation, clamped to [1, n - 1] so that every
    class with at least two items appears on both sides (a class of one item is adaptation only).
    Deterministic in ``seed``; independent of the order classes appear in.
    """
    if not 0.0 < eval_share < 1.0:
        raise ValueError(f"eval_share must be in (0, 1), got {eval_share}")
    by_class: dict[int, list[int]] = defaultdict(list)
    for i, y in enumerate(labels):
        by_class[int(y)].append(i)
    adapt: list[int] = []
    held: list[int] = []
    for y in sorted(by_class):
        members = list(by_class[y])
        random.Random(f"split:{seed}:{y}").shuffle(members)
        n = len(members)
        n_eval = 0 if n < 2 else min(max(1, round(eval_share * n)), n - 1)
        held += members[:n_eval]
        adapt += members[n_eval:]
    return sorted(adapt), sorted(held)


def cap_indices(indices: Sequence[int], cap: int | None, seed: int) -> list[int]:
    """A seeded uniform subset of at most ``cap`` of ``indices`` (sorted); all of them when cap is None."""
    if cap is None or len(indices) <= cap:
        return sorted(indices)
    return sorted(random.Random(f"cap:{seed}").sample(list(indices), cap))


def fraction_size(n: int, fraction: float, minimum: int = 2) -> int:
    """How many of ``n`` images a fraction keeps: ``round(fraction * n)``, at least ``minimum``, at most n."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    return min(n, max(minimum, round(fraction * n)))


def fraction_subset(n: int, fraction: float, seed: int, minimum: int = 2) -> list[int]:
    """Sorted positions of a label-blind subset of ``range(n)``: a prefix of one seeded permutation.

    Prefixes of the same permutation make the subsets of one seed nested (1 % ⊂ 10 % ⊂ 100 %).
    """
    order = list(range(n))
    random.Random(f"fraction:{seed}").shuffle(order)
    return sorted(order[: fraction_size(n, fraction, minimum)])


@dataclass
class Diagnostics:
    """Retrieval quality of one set of neighbour lists (fractions are in [0, 1]; NaN when undefined)."""

    n_queries: int = 0
    n_neighbours: int = 0
    known_fraction: float = math.nan  # neighbours whose subcategory is known (emoji of another style)
    same_label_fraction: float = math.nan  # of the known ones: the query's true subcategory
    same_item_fraction: float = math.nan  # of the known ones: the very same emoji in another style
    queries_with_same_label: float = math.nan  # queries with >= 1 same-subcategory neighbour
    chance_same_label: float = math.nan  # same_label_fraction expected from uniform draws of known items
    sources: dict[str, float] = field(default_factory=dict)  # share of neighbours per pool source

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def retrieval_diagnostics(neighbours: Sequence[Sequence[str]], query_labels: Sequence[str],
                          query_items: Sequence[str], side: Mapping[str, tuple[str, str]],
                          pool_labels: Iterable[str] = ()) -> Diagnostics:
    """Compare each query's retrieved pool ids with its true subcategory.

    ``neighbours``: per query, pool ids (``''`` = missing, ignored); ``side``: pool id -> (subcategory,
    item key) for pool items of known label (other emoji styles; the item key is the emoji code).
    ``pool_labels``: the subcategories of every known-label item of the pool, for the chance level.
    A pool id's source is the part before its first ``/``.
    """
    if len(neighbours) != len(query_labels) or len(query_labels) != len(query_items):
        raise ValueError("neighbours, query_labels and query_items must have the same length")
    total = known = same = same_item = hit_queries = 0
    sources: Counter[str] = Counter()
    for row, label, item in zip(neighbours, query_labels, query_items, strict=True):
        hit = False
        for pid in row:
            if not pid:
                continue
            total += 1
            sources[pid.split("/", 1)[0]] += 1
            info = side.get(pid)
            if info is None:
                continue
            known += 1
            if info[0] == label:
                same += 1
                hit = True
                same_item += info[1] == item
        hit_queries += hit
    d = Diagnostics(n_queries=len(query_labels), n_neighbours=total)
    if total:
        d.known_fraction = known / total
        d.sources = {s: c / total for s, c in sorted(sources.items())}
    if known:
        d.same_label_fraction = same / known
        d.same_item_fraction = same_item / known
    if query_labels:
        d.queries_with_same_label = hit_queries / len(query_labels)
    counts = Counter(pool_labels)
    n_pool = sum(counts.values())
    if n_pool and query_labels:
        d.chance_same_label = sum(counts[q] / n_pool for q in query_labels) / len(query_labels)
    return d


def holdout_indices(adapt_idx: Sequence[int], subset: Sequence[int], labels: Sequence[int], per_class: int,
                    seed: int) -> list[int]:
    """An acceptance holdout: up to ``per_class`` images of each class from the adaptation part ``adapt_idx`` that
    are not in the adapted ``subset`` (indices into the style; ``labels[i]`` is image i's class), sorted.

    Per class a seeded permutation of its images outside the subset, of which the first ``per_class`` are taken, so
    holdouts of one seed are nested (1 ⊂ 2 ⊂ 4 per class); a class with fewer such images gives what it has.
    Never overlaps ``subset`` (ValueError if it would: a holdout is never trained on)."""
    if per_class < 1:
        raise ValueError(f"per_class must be at least 1, got {per_class}")
    taken = set(subset)
    by_class: dict[int, list[int]] = defaultdict(list)
    for i in sorted(set(adapt_idx) - taken):
        by_class[int(labels[i])].append(i)
    out: list[int] = []
    for y in sorted(by_class):
        members = by_class[y]
        random.Random(f"holdout:{seed}:{y}").shuffle(members)
        out += members[:per_class]
    if taken & set(out):
        raise ValueError("a holdout image is in the adapted subset")
    return sorted(out)

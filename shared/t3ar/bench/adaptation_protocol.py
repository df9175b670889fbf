"""The adaptation benchmark's protocol and its pure computations (no I/O, no training).

* :class:`Plan`: every choice of a benchmark run (shifts, seeds, fractions, schedule, ablations); ``FULL``
  and ``QUICK`` are the two presets of ``t3ar bench adapt``.
* :func:`split_adapt_eval`: the fixed, stratified split of a target style into an adaptation part and a
  held-out evaluation part (the same evaluation images for every fraction, method and seed).
* :func:`fraction_subset`: the seeded, label-blind, nested subsets (1 % ⊂ 10 % ⊂ 100 %) of the adaptation part.
* :func:`aggregate`: mean ± sample standard deviation over seeds, per shift and averaged over shifts.
* :func:`retrieval_diagnostics`: how often retrieved neighbours share the query's true subcategory.
"""

from __future__ import annotations

import math
import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from t3ar.method.config import METHODS

#: Target styles of the four shifts (the source is always the Google style).
SHIFTS: tuple[str, ...] = ("twitter", "openmoji", "openmoji-black", "fluent3d")
SOURCE_STYLE = "google"
#: Methods that are compared with T3AR in the goal (the paper's baselines; T3AR-random is an ablation).
BASELINES: tuple[str, ...] = ("source", "tent", "shot-im", "adacontrast", "t3ar-noretrieval")
AVERAGE = "average"


@dataclass(frozen=True)
class Plan:
    """Everything a benchmark run decides. Hyper-parameters not listed are ``AdaptConfig`` defaults."""

    name: str
    shifts: tuple[str, ...] = SHIFTS
    seeds: tuple[int, ...] = (0, 1, 2)
    fractions: tuple[float, ...] = (0.01, 0.1, 1.0)
    methods: tuple[str, ...] = METHODS
    image_size: int = 64  # the emoji kit's native size
    eval_share: float = 0.65  # of each class of the target style, held out for evaluation
    split_seed: int = 0  # the split is fixed: it does not change with the run seed
    max_adapt: int | None = None  # caps (quick mode only)
    max_eval: int | None = None
    epochs: int = 1
    min_steps: int = 20
    batch_size: int = 32
    lr: float = 1e-3
    train_groups: int = 2
    k: int = 5
    source_epochs: int = 6
    source_lr: float = 0.02
    retriever_size: int = 96
    pool_cap: int | None = None  # max images per pool source (openclipart, tuxpaint, each emoji style)
    ablation_fraction: float = 0.1
    ablation_seeds: tuple[int, ...] = (0, 1)
    ablation_ks: tuple[int, ...] = (1, 2)  # k = 5 and random retrieval come from the main grid

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


FULL = Plan(name="full")
QUICK = Plan(name="quick", shifts=("twitter",), seeds=(0,), max_adapt=160, max_eval=240, min_steps=4,
             source_epochs=1, pool_cap=150, ablation_seeds=(0,), ablation_ks=(1,))


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


def mean_std(values: Iterable[float]) -> dict[str, float | int]:
    """``{'mean', 'std', 'n'}``; std is the sample standard deviation (ddof = 1), 0.0 for one value."""
    vals = [float(v) for v in values]
    if not vals:
        return {"mean": math.nan, "std": math.nan, "n": 0}
    m = sum(vals) / len(vals)
    sd = math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
    return {"mean": m, "std": sd, "n": len(vals)}


def aggregate(records: Sequence[Mapping[str, Any]], metric: str = "top1") -> list[dict[str, Any]]:
    """Mean ± std over seeds of ``metric``, grouped by (variant, method, fraction, shift).

    Records need ``variant``, ``method``, ``fraction``, ``shift``, ``seed`` and ``metric``. A row with
    ``shift == 'average'`` is added per (variant, method, fraction): each seed's mean over the shifts it
    has *all* of (the shifts present in that group), then mean ± std over those seeds.
    """
    groups: dict[tuple[str, str, float, str], dict[int, float]] = defaultdict(dict)
    for r in records:
        groups[(str(r["variant"]), str(r["method"]), float(r["fraction"]), str(r["shift"]))][int(r["seed"])] = \
            float(r[metric])
    rows: list[dict[str, Any]] = []
    by_cell: dict[tuple[str, str, float], dict[str, dict[int, float]]] = defaultdict(dict)
    for (variant, method, fraction, shift), per_seed in sorted(groups.items()):
        rows.append({"variant": variant, "method": method, "fraction": fraction, "shift": shift,
                     **mean_std(per_seed[s] for s in sorted(per_seed)), "seeds": sorted(per_seed)})
        by_cell[(variant, method, fraction)][shift] = per_seed
    for (variant, method, fraction), shifts in sorted(by_cell.items()):
        seeds = sorted(set.intersection(*(set(v) for v in shifts.values())))
        per_seed_avg = [sum(shifts[sh][s] for sh in shifts) / len(shifts) for s in seeds]
        rows.append({"variant": variant, "method": method, "fraction": fraction, "shift": AVERAGE,
                     **mean_std(per_seed_avg), "seeds": seeds, "shifts": sorted(shifts)})
    return rows


def lookup(rows: Sequence[Mapping[str, Any]], *, variant: str, method: str, fraction: float,
           shift: str = AVERAGE) -> Mapping[str, Any] | None:
    """The aggregate row for one cell, or None."""
    for r in rows:
        if (r["variant"], r["method"], r["shift"]) == (variant, method, shift) and \
                math.isclose(float(r["fraction"]), fraction):
            return r
    return None


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


def goal_verdict(rows: Sequence[Mapping[str, Any]], *, low: Sequence[float] = (0.01, 0.1), high: float = 1.0,
                 margin: float = 0.03) -> dict[str, Any]:
    """The issue's goal on the shift-averaged main results.

    At every ``low`` fraction T3AR must beat the best of :data:`BASELINES` by ``margin`` (accuracy units);
    at ``high`` it must not be below T3AR without retrieval. ``met`` is None when a cell is
    missing (e.g. a quick run without those fractions).
    """
    checks: list[dict[str, Any]] = []
    for f in low:
        t = lookup(rows, variant="main", method="t3ar", fraction=f)
        base = [(b, r) for b in BASELINES if (r := lookup(rows, variant="main", method=b, fraction=f))]
        if t is None or not base:
            checks.append({"fraction": f, "kind": "low", "met": None})
            continue
        name, best = max(base, key=lambda br: float(br[1]["mean"]))
        gap = float(t["mean"]) - float(best["mean"])
        checks.append({"fraction": f, "kind": "low", "t3ar": t["mean"], "best_baseline": name,
                       "best_baseline_mean": best["mean"], "gap": gap, "needed": margin, "met": gap >= margin})
    t, ada = (lookup(rows, variant="main", method=m, fraction=high) for m in ("t3ar", "t3ar-noretrieval"))
    if t is None or ada is None:
        checks.append({"fraction": high, "kind": "high", "met": None})
    else:
        gap = float(t["mean"]) - float(ada["mean"])
        checks.append({"fraction": high, "kind": "high", "t3ar": t["mean"], "t3ar-noretrieval": ada["mean"],
                       "gap": gap, "needed": 0.0, "met": gap >= 0.0})
    states = [c["met"] for c in checks]
    return {"met": None if None in states else all(states), "checks": checks}

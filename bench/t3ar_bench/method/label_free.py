"""Label-free selection, measured: how often each criterion of :mod:`t3ar.method.selection` picks the better of
bn-adapt and the default T3AR. Pure functions of the run records (no I/O, no torch).

A *cell* is a (shift, seed, fraction) where the two differ by more than ``margin`` (a point) in evaluation top-1.
For each criterion a cell has ``delta`` = score(default) − score(bn-adapt) on the target (higher is better; for
agreement with bn-adapt, bn-adapt's own is 1). The rule picks the default when ``delta`` > a threshold; the
threshold is fitted leave-one-shift-out: on the other shifts' cells, the one that is right most often (a tie: the
one nearest 0), then applied to the held-out shift's cells. ``share_at_zero`` is the literature's rule as is
(threshold 0: the better score wins; agreement then always keeps bn-adapt).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

#: the criteria in each run's ``criteria`` (SND on the softmax outputs and on the bottleneck features) and agreement
CRITERIA: tuple[str, ...] = ("entropy", "im", "agreement", "snd", "snd_features")
#: the share a criterion must reach to guard a job without a holdout
REQUIRED_SHARE = 0.9


def selection_cells(records: Sequence[Mapping[str, Any]], default: str = "t3ar", reference: str = "bn-adapt",
                    margin: float = 0.01) -> list[dict[str, Any]]:
    """The cells where ``default`` and ``reference`` (test-grid labels) differ by more than ``margin`` (a share:
    0.01 = one point), each with ``better`` (True when the default is) and ``delta`` per criterion."""
    runs: dict[tuple[str, int, float], dict[str, Mapping[str, Any]]] = {}
    for r in records:
        if r.get("label") in (default, reference) and r["phase"] == "main" and r.get("criteria"):
            runs.setdefault((r["shift"], int(r["seed"]), float(r["fraction"])), {})[r["label"]] = r
    out = []
    for (shift, seed, f), arms in sorted(runs.items()):
        if set(arms) != {default, reference}:
            continue
        d, b = arms[default], arms[reference]
        gap = float(d["top1"]) - float(b["top1"])
        if abs(gap) <= margin:
            continue
        delta = {c: float(d["criteria"][c]) - float(b["criteria"][c]) for c in CRITERIA
                 if c in d["criteria"] and c in b["criteria"]}
        pd, pb = d.get("target_predictions"), b.get("target_predictions")
        if pd and pb and len(pd) == len(pb):
            delta["agreement"] = sum(x == y for x, y in zip(pd, pb, strict=True)) / len(pd) - 1.0
        out.append({"shift": shift, "seed": seed, "fraction": f, "gap": gap, "better": gap > 0, "delta": delta})
    return out


def _right(cells: Sequence[Mapping[str, Any]], criterion: str, threshold: float) -> int:
    return sum((c["delta"][criterion] > threshold) == c["better"] for c in cells)


def fit_threshold(cells: Sequence[Mapping[str, Any]], criterion: str) -> float:
    """The threshold on ``delta`` that is right most often on ``cells`` (candidates: 0, every midpoint between
    consecutive deltas, and one below / above them all: always / never the default); a tie goes to the one nearest
    0, then the lower. 0 without cells."""
    ds = sorted({float(c["delta"][criterion]) for c in cells})
    if not ds:
        return 0.0
    cands = {0.0, ds[0] - 1.0, ds[-1] + 1.0, *((a + b) / 2 for a, b in zip(ds, ds[1:], strict=False))}
    return max(sorted(cands), key=lambda t: (_right(cells, criterion, t), -abs(t), -t))


def leave_one_shift_out(cells: Sequence[Mapping[str, Any]], criteria: Sequence[str] = CRITERIA
                        ) -> dict[str, dict[str, Any]]:
    """Per criterion ``{cells, right, share, share_at_zero, thresholds}``, leave-one-shift-out (the module
    docstring); ``share`` is NaN without cells."""
    out: dict[str, dict[str, Any]] = {}
    shifts = sorted({c["shift"] for c in cells})
    for crit in criteria:
        have = [c for c in cells if crit in c["delta"]]
        right, thresholds = 0, {}
        for sh in shifts:
            train = [c for c in have if c["shift"] != sh]
            test = [c for c in have if c["shift"] == sh]
            if not test:
                continue
            thresholds[sh] = fit_threshold(train, crit)
            right += _right(test, crit, thresholds[sh])
        n = len(have)
        out[crit] = {"cells": n, "right": right, "share": right / n if n else math.nan,
                     "share_at_zero": _right(have, crit, 0.0) / n if n else math.nan, "thresholds": thresholds}
    return out


def verdict(per: Mapping[str, Mapping[str, Any]], margin: float = 0.01) -> dict[str, Any]:
    """``best`` (the criterion with the highest leave-one-shift-out share; None without cells) and ``meets`` (its
    share is at least :data:`REQUIRED_SHARE`: it may guard a job without a holdout)."""
    scored = [c for c, d in per.items() if d["cells"]]
    best = max(scored, key=lambda c: per[c]["share"]) if scored else None
    return {"best": best, "share": per[best]["share"] if best else None, "required_share": REQUIRED_SHARE,
            "meets": bool(best is not None and per[best]["share"] >= REQUIRED_SHARE),
            "cells": max((d["cells"] for d in per.values()), default=0), "margin_points": 100 * margin}

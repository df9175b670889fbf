"""The mixed-pool goals (issue 52): paired differences in points over shift x seed, per fraction."""

from __future__ import annotations

import pytest

from t3ar_bench.retrieval.mixed_goals import MIXED_GOALS, mixed_goals
from t3ar_bench.retrieval.mixed_main import MIXED_ARMS


def _rec(label: str, shift: str, seed: int, top1: float, phase: str = "mixed") -> dict[str, object]:
    return {"label": label, "shift": shift, "seed": seed, "fraction": 0.1, "top1": top1, "phase": phase}


def test_every_goal_names_arms_the_cell_runs() -> None:
    arms = {label for label, *_ in MIXED_ARMS}
    assert {a for pair in MIXED_GOALS.values() for a in pair} <= arms


def test_mixed_goals_pair_the_cells_and_leave_out_incomplete_ones() -> None:
    records = [_rec("t3ar", s, seed, 0.50 + 0.01 * seed + (0.04 if s == "a" else 0.02))
               for s in ("a", "b") for seed in (0, 1)]
    records += [_rec("t3ar-random", s, seed, 0.50 + 0.01 * seed) for s in ("a", "b") for seed in (0, 1)]
    records += [_rec("t3ar-labels", "a", 0, 0.9), _rec("t3ar-random", "a", 0, 0.0, phase="main")]
    got = mixed_goals(records, ["a", "b"], [0, 1], [0.1])
    assert set(got) == {"mixed_retrieval_vs_uniform"}  # the labelled goal lacks cells
    cell = got["mixed_retrieval_vs_uniform"]["test"]["0.1"]
    assert cell["mean"] == pytest.approx(3.0) and cell["n"] == 4
    assert cell["per_shift"] == pytest.approx({"a": 4.0, "b": 2.0}) and cell["lo"] < 3.0 < cell["hi"]

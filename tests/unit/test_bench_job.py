"""``t3ar bench job``'s rounds and report (bench/t3ar_bench/job) with a fake runner: the ratio is the median of
the per-round ratios, the phases their per-phase medians, the arms alternate, and both files are written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from t3ar_bench.job.main import run_rounds


class FakeRunner:
    def __init__(self, stacks: list[float], ins: list[float], steps: list[float],
                 warms: list[float] | None = None) -> None:
        self.stacks, self.ins, self.steps = stacks, ins, steps
        self.warms = warms or [x / 2 for x in ins]
        self.calls: list[str] = []

    def stack(self) -> tuple[float, dict[str, Any]]:
        self.calls.append("stack")
        i = self.calls.count("stack") - 1
        return self.stacks[i], {"phases": {"queue_wait": 0.1 * (i + 1), "steps": self.steps[i], "other": 1.0},
                                "seconds_total": self.stacks[i] - 1}

    def fresh(self) -> dict[str, Any]:
        self.calls.append("in")
        i = self.calls.count("in") - 1
        return {"wall_s": self.ins[i], "phases": {"steps": self.steps[i] - 1, "model_loaded": 1.0}, "imports_s": 7.0}

    def in_process(self) -> dict[str, Any]:
        self.calls.append("warm")
        i = self.calls.count("warm") - 1
        return {"wall_s": self.warms[i], "phases": {"steps": self.steps[i] / 2}}


def test_ratio_and_phases_are_medians_of_side_by_side_rounds(tmp_path: Path) -> None:
    runner = FakeRunner([30.0, 24.0, 40.0], [20.0, 20.0, 20.0], [10.0, 30.0, 20.0])
    summary = run_rounds(runner, 3, {"config": {"k": 5}}, tmp_path)
    # the order is reversed every other round
    assert runner.calls == ["stack", "in", "warm", "warm", "in", "stack", "stack", "in", "warm"]
    assert summary["ratio"] == pytest.approx(1.5)  # ratios 1.5, 1.2, 2.0 against the fresh process
    assert summary["ratio_warm"] == pytest.approx(3.0)  # the warm arm took half as long
    assert summary["phases"] == {"queue_wait": 0.2, "steps": 20.0, "other": 1.0}
    assert summary["phases_fresh"] == {"steps": 19.0, "model_loaded": 1.0}
    assert summary["phases_warm"] == {"steps": 10.0}
    assert summary["stack_wall_s"] == 30.0 and summary["in_process_wall_s"] == 20.0
    assert summary["warm_wall_s"] == 10.0 and summary["fresh_imports_s"] == 7.0
    on_disk = json.loads((tmp_path / "job-overhead.json").read_text())
    assert on_disk["ratio"] == summary["ratio"] and len(on_disk["rounds"]) == 3 and on_disk["commit"]
    md = (tmp_path / "job-overhead.md").read_text()
    assert "ratio (stack wall ÷ fresh in-process wall, median): 1.50" in md and "warm process: 3.00" in md
    assert "| steps | 20.00 | 19.00 | 10.00 |" in md and "| model loaded |  | 1.00 |  |" in md
    assert "| queue wait | 0.20 |  |  |" in md and summary["commit"] in md


def test_no_rounds_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no rounds"):
        run_rounds(FakeRunner([], [], []), 0, {}, tmp_path)
    assert not (tmp_path / "job-overhead.json").exists()

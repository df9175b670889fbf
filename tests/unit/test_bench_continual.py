"""`t3ar bench continual`'s smoke path, shrunk: every arm runs the stream, the growing arms' pools grow through
the real contribution mechanism and their later steps retrieve past targets, the arms are paired (identical
pools at step 0 give identical accuracy), and the report files are written. Plus the pure parts: the arms'
configs from a frozen selection and the summary's paired differences."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from t3ar_bench.continual.plan import PLANS, arm_config, frozen_retriever
from t3ar_bench.continual.report import summarise, verdict


def test_arm_configs_take_the_frozen_choices_and_cap_steps() -> None:
    plan = dataclasses.replace(PLANS["cpu"], max_steps=20, batch_size=32)
    sel = {"lr": {"t3ar": 2e-4, "t3ar-noretrieval": 1e-3}, "contrastive": {"t3ar": {"temperature": 0.5},
           "t3ar-noretrieval": {"temperature": 0.2}}, "t3ar_options": {"redraw_neighbours": True}}
    t = arm_config(plan, sel, "growing", seed=3, n_adapt=320)
    assert (t["method"], t["lr"], t["temperature"], t["redraw_neighbours"], t["seed"]) == ("t3ar", 2e-4, 0.5, True, 3)
    assert t["epochs"] == 2  # 10 steps an epoch, at most 20 steps
    n = arm_config(plan, sel, "none", seed=3, n_adapt=320)
    assert (n["method"], n["lr"], n["temperature"]) == ("t3ar-noretrieval", 1e-3, 0.2) and "redraw_neighbours" not in n
    assert arm_config(plan, {}, "static", seed=0, n_adapt=5)["batch_size"] == 5
    grid = {"lr": {"t3ar-noretrieval": 3e-3}, "term": {"temperature": 0.2},
            "validated": {"method": "t3ar", "retriever": "efficientnet_lite1",
                          "options": {"temperature": 0.2, "neighbours_as_data": True}}}  # the grid protocol's form
    g = arm_config(plan, grid, "curated", seed=0, n_adapt=320)
    assert (g["lr"], g["temperature"], g["neighbours_as_data"]) == (3e-3, 0.2, True)
    assert arm_config(plan, grid, "none", seed=0, n_adapt=320) == {**n, "lr": 3e-3, "temperature": 0.2, "seed": 0}
    assert frozen_retriever(grid) == "efficientnet_lite1" and frozen_retriever({}) == "efficientnet_lite0"
    diag = PLANS["cpu-data"]  # the diagnostic adds its option to T3AR only, over the frozen choices
    assert diag.arms == ("static", "growing") and diag.note
    frozen = arm_config(PLANS["cpu"], grid, "growing", seed=0, n_adapt=320)
    assert arm_config(diag, grid, "growing", seed=0, n_adapt=320) == {**frozen, "pool_data_weight": 1.0}
    assert arm_config(diag, grid, "none", seed=0, n_adapt=320) == arm_config(PLANS["cpu"], grid, "none", seed=0,
                                                                            n_adapt=320)
    assert "pool_data_weight" not in frozen


def test_summary_pairs_over_seeds() -> None:
    recs = [{"seed": s, "arm": a, "step": t, "top1": 0.5 + (0.1 if a == "growing" and t == 1 else 0) + 0.01 * s,
             "pool_size": 10, "past_target_share": 0.0} for s in (0, 1, 2) for a in ("static", "growing")
            for t in (0, 1)]
    s = summarise(recs, (0, 1, 2), 2)
    later = s["diffs"]["growing"]["later_steps"]
    assert later["mean"] == pytest.approx(0.1) and later["n"] == 3
    assert "helps" in verdict(s)
    flows = summarise([{**r, "top1_before": 0.4, "contributed": {"added": 7, "skipped_exact": 1, "skipped_near": 2}}
                       if r["arm"] == "growing" else r for r in recs], (0, 1, 2), 2)
    assert flows["flows"]["growing"][1] == {"step": 1, "added": 7, "skipped": 3, "removed": 0}
    assert flows["before"][0]["top1"] == pytest.approx(0.4)


@pytest.mark.slow
def test_smoke_stream_runs_every_arm(tmp_path: Path) -> None:
    from t3ar_bench.continual.main import run_continual

    plan = dataclasses.replace(PLANS["smoke"], name="smoke-test", stream=("ink", "neon"), adapt_cap=12)
    res = run_continual(plan, out_dir=tmp_path / "out", work=tmp_path / "work")
    recs = res["records"]
    assert len(recs) == len(plan.seeds) * 4 * 2
    by = {(r["seed"], r["arm"], r["step"]): r for r in recs}
    for s in plan.seeds:
        assert by[(s, "static", 0)]["top1"] == by[(s, "growing", 0)]["top1"] == by[(s, "curated", 0)]["top1"]
        assert by[(s, "static", 1)]["pool_size"] == by[(s, "static", 0)]["pool_size"] == plan.pool_cap  # capped
        grown = by[(s, "growing", 0)]["contributed"]["added"]
        assert grown > 0 and by[(s, "growing", 1)]["pool_size"] == by[(s, "growing", 0)]["pool_size"] + grown
        assert by[(s, "growing", 1)]["past_target_share"] > 0
        assert by[(s, "growing", 0)]["r_past_share"] == 0 < by[(s, "growing", 1)]["r_past_share"]
        assert 0 <= by[(s, "growing", 1)]["r_past_same_class"] <= 1 and "r_past_share" not in by[(s, "none", 1)]
        assert by[(s, "curated", 1)]["pool_size"] <= by[(s, "growing", 1)]["pool_size"]
        assert by[(s, "none", 1)]["pool_size"] == 0 and by[(s, "none", 1)]["neighbours_used"] == 0
    for ext in ("md", "json", "png"):
        assert (tmp_path / "out" / f"continual-smoke-test.{ext}").stat().st_size > 0
    report = (tmp_path / "out" / "continual-smoke-test.md").read_text()
    assert "base model (no adaptation)" in report and "curated: contributed after the step" in report
    assert "growing: R's top-2 from past targets" in report
    assert json.loads((tmp_path / "out" / "continual-smoke-test.json").read_text())["summary"]["arms"] == [
        "static", "growing", "curated", "none"]

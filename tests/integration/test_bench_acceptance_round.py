"""The cpu plan's acceptance round end to end on a small synthetic kit (``t3ar_bench.method.main``): archive styles
as targets, two validation shifts, the grid, each run's holdouts and label-free criteria, the goals and the report
files. Two optimiser steps per run: it shows the protocol runs to its results files, not results."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_gpu_grid import CLASSES, ITEMS, _image, _kit

import t3ar_bench.method.runs as runs
from t3ar_bench.method.main import run_method_benchmark
from t3ar_bench.method.plans import CPU, NO_HARM_OPTIONS, RETRIEVAL_OPTIONS

pytestmark = pytest.mark.slow

GOALS = ("accepted_vs_bn_adapt", "accepted_vs_source", "accepted_vs_hindsight", "no_harm", "labelled_vs_random",
         "labelled_vs_bn_adapt")


def test_the_acceptance_round_runs_to_its_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kits = _kit(tmp_path / "kit")
    rng = np.random.default_rng(1)
    assert kits.archive is not None
    for c, cls in enumerate(CLASSES):  # the weak validation style: monochrome
        (kits.archive / "fluent-emoji-high-contrast" / cls).mkdir(parents=True)
        for i in range(ITEMS):
            _image(4, c, i, rng).convert("L").convert("RGB").save(
                kits.archive / "fluent-emoji-high-contrast" / cls / f"{c:02d}{i:02d}.png")
    monkeypatch.setattr(runs, "build_kits", lambda work, cache, styles=(): kits)
    plan = dataclasses.replace(
        CPU, name="smoke", eval_shifts=("twitter", "emojione"), seeds=(0, 1), select_seeds=(0,), fractions=(0.3,),
        low_fractions=(0.3,), max_steps=2, min_steps=2, epochs=1, batch_size=4, image_size=32, retriever_size=32,
        source_epochs=1, archive_styles=("emojione", "fluent-emoji-high-contrast"), workers=1, lr_grid=(1e-3,),
        contrastive_settings=(), retrieval_options=(RETRIEVAL_OPTIONS[0],), no_harm_options=(NO_HARM_OPTIONS[0],),
        label_options=(), bn_groups=(2,), holdout_per_class=(1, 2))
    out = tmp_path / "out"
    run_method_benchmark(plan, out_dir=out, work=tmp_path / "work", cache=tmp_path / "cache",
                         device=torch.device("cpu"))
    res = json.loads((out / "adaptation-smoke.json").read_text())
    assert res["evaluation_shifts"] == ["twitter", "emojione"]  # an archive style is a target
    assert res["selection"]["shifts"] == ["fluent3d", "fluent-emoji-high-contrast"]
    for key in GOALS:
        d = res["goals"][key]["test"]["0.3"]
        assert d["n"] == 4 and set(d["per_shift"]) == {"twitter", "emojione"}
    assert set(res["goals"]["acceptance_curve"]) == {"1", "2"}
    assert set(res["label_free_selection"]) == {"entropy", "im", "agreement", "snd", "snd_features"}
    grid = [r for r in res["records"] if r["phase"] == "main"]
    # 3 adaptation images per class, 4 of the 12 adapted: 1 per class where one is left, more at 2 per class
    held = [r["holdout"] for r in grid if r["label"] in ("source", "bn-adapt", "t3ar")]
    assert len(held) == 12 and all(1 <= h["1"]["n"] <= len(CLASSES) <= h["2"]["n"] <= 8 for h in held)
    assert not any("target_predictions" in r for r in res["records"])
    for name in ("adaptation-smoke.md", "adaptation-smoke.png", "adaptation-smoke-goals.png"):
        assert (out / name).is_file()
    md = (out / "adaptation-smoke.md").read_text()
    assert "## Acceptance on a labelled holdout" in md and "## Label-free selection" in md

"""The pure parts of `t3ar bench adapt`: split and subsets, retrieval diagnostics, paired statistics, the
summary and its verdict, the report."""

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from t3ar_bench.method import plans as grid_plans
from t3ar_bench.method.grid import ORACLE, grid_arms, summarise_grid
from t3ar_bench.method.plans import PLANS, QUICK, paired, t_quantile
from t3ar_bench.method.protocol import (
    cap_indices,
    fraction_size,
    fraction_subset,
    retrieval_diagnostics,
    split_adapt_eval,
)


def _labels() -> list[int]:
    # 5 classes of sizes 2, 3, 4, 10, 1
    sizes = [2, 3, 4, 10, 1]
    return [c for c, n in enumerate(sizes) for _ in range(n)]


def test_split_is_deterministic_disjoint_and_stratified() -> None:
    labels = _labels()
    a1, e1 = split_adapt_eval(labels, 0.5, seed=0)
    a2, e2 = split_adapt_eval(labels, 0.5, seed=0)
    assert (a1, e1) == (a2, e2)
    assert sorted(a1 + e1) == list(range(len(labels))) and not set(a1) & set(e1)
    per_class_eval = {c: sum(labels[i] == c for i in e1) for c in range(5)}
    assert per_class_eval == {0: 1, 1: 2, 2: 2, 3: 5, 4: 0}  # clamp to [1, n-1]; a class of 1 is adaptation only
    assert all(any(labels[i] == c for i in a1) for c in range(5))
    a3, e3 = split_adapt_eval(labels, 0.5, seed=1)
    assert e3 != e1  # another split seed gives another split


def test_split_ignores_item_order_of_other_classes() -> None:
    labels = _labels()
    _, e = split_adapt_eval(labels, 0.5, seed=0)
    # dropping class 0 changes indices but not which members of class 3 are held out (per-class RNG)
    shifted = labels[2:]
    _, e_shift = split_adapt_eval(shifted, 0.5, seed=0)
    assert {i - 2 for i in e if labels[i] == 3} == {i for i in e_shift if shifted[i] == 3}


def test_split_rejects_bad_share() -> None:
    with pytest.raises(ValueError):
        split_adapt_eval([0, 0], 1.0, 0)


def test_fraction_subsets_are_seeded_nested_and_floored() -> None:
    n = 925
    s1, s10, s100 = (fraction_subset(n, f, seed=3) for f in (0.01, 0.1, 1.0))
    assert len(s1) == 9 and len(s10) == 92 and s100 == list(range(n))
    assert set(s1) <= set(s10) <= set(s100)
    assert fraction_subset(n, 0.1, seed=3) == s10 and fraction_subset(n, 0.1, seed=4) != s10
    assert fraction_size(50, 0.01) == 2 and fraction_size(3, 1.0) == 3
    with pytest.raises(ValueError):
        fraction_size(10, 0.0)


def test_cap_indices() -> None:
    assert cap_indices([5, 1, 3], None, 0) == [1, 3, 5]
    capped = cap_indices(list(range(100)), 10, 0)
    assert len(capped) == 10 and capped == sorted(capped) and capped == cap_indices(list(range(100)), 10, 0)


def test_retrieval_diagnostics() -> None:
    side = {"openmoji/1f600": ("face-smiling", "1f600"), "openmoji/1f601": ("face-smiling", "1f601"),
            "fluent3d/1f436": ("animal-mammal", "1f436")}
    neighbours = [["openmoji/1f600", "openclipart/abc", "fluent3d/1f436", ""],  # query: 1f600 face-smiling
                  ["openmoji/1f601", "openclipart/def", "tuxpaint/x", "openclipart/ghi"]]  # 1f436 animal-mammal
    d = retrieval_diagnostics(neighbours, ["face-smiling", "animal-mammal"], ["1f600", "1f436"], side,
                              pool_labels=["face-smiling", "face-smiling", "animal-mammal"])
    assert d.n_queries == 2 and d.n_neighbours == 7  # '' is ignored
    assert math.isclose(d.known_fraction, 3 / 7)
    assert math.isclose(d.same_label_fraction, 1 / 3)  # only openmoji/1f600 for query 0
    assert math.isclose(d.same_item_fraction, 1 / 3)  # ... and it is the same emoji
    assert math.isclose(d.queries_with_same_label, 0.5)
    assert math.isclose(d.chance_same_label, (2 / 3 + 1 / 3) / 2)
    assert math.isclose(d.sources["openclipart"], 3 / 7) and math.isclose(d.sources["tuxpaint"], 1 / 7)


def test_retrieval_diagnostics_without_known_items_is_nan() -> None:
    d = retrieval_diagnostics([["openclipart/a"]], ["x"], ["1"], {})
    assert d.known_fraction == 0.0 and math.isnan(d.same_label_fraction) and math.isnan(d.chance_same_label)
    with pytest.raises(ValueError):
        retrieval_diagnostics([["a"]], ["x", "y"], ["1", "2"], {})


def test_t_quantiles_and_paired_ci() -> None:
    assert math.isclose(t_quantile(0.975, 4), 2.776, abs_tol=1e-3)  # tables: t(0.975; 4) = 2.776
    assert math.isclose(t_quantile(0.975, 1), 12.706, abs_tol=1e-2)
    d = paired([0.5, 0.6, 0.7, 0.6, 0.5], [0.4, 0.5, 0.6, 0.6, 0.5])
    diffs = [0.1, 0.1, 0.1, 0.0, 0.0]
    m = sum(diffs) / 5
    sd = math.sqrt(sum((x - m) ** 2 for x in diffs) / 4)
    assert math.isclose(d["mean"], m) and math.isclose(d["hi"] - d["mean"], t_quantile(0.975, 4) * sd / math.sqrt(5))
    assert d["lo"] < m < d["hi"]
    assert paired([0.5], [0.4])["n"] == 1 and math.isnan(paired([0.5], [0.4])["lo"])
    with pytest.raises(ValueError):
        paired([0.1, 0.2], [0.1])


def _grid_records(gain: float, noise: list[float], *, bn: float = 0.33) -> list[dict[str, object]]:
    """A fake grid on the quick plan: validated T3AR = T3AR without retrieval + gain (+ per-seed noise)."""
    plan = QUICK
    base = {"source": 0.30, "bn-adapt": bn, "tent": 0.31, "shot-im": 0.33, "adacontrast": 0.34,
            "t3ar-noretrieval": 0.35, "t3ar-paper": 0.35, ORACLE: 0.37}
    train = {"supervised": 0.36, "t3ar-noretrieval": 0.35, "t3ar-paper": 0.35}
    recs: list[dict[str, object]] = []
    for shift in plan.eval_shifts:
        for i, seed in enumerate(plan.seeds):
            for f in sorted(set(plan.fractions) | set(plan.train_fractions)):
                common = {"shift": shift, "seed": seed, "fraction": f, "method": "x"}
                recs += [{**common, "phase": "main", "label": m, "top1": acc} for m, acc in base.items()]
                recs.append({**common, "phase": "main", "label": "t3ar", "top1": 0.35 + gain + noise[i],
                             "pool_data": {"per_step": 6.0, "known_per_step": 3.0, "correct_share": 0.7}})
                recs += [{**common, "phase": "train", "label": m, "top1": acc} for m, acc in train.items()]
                recs.append({**common, "phase": "train", "label": "t3ar", "top1": 0.35 + gain + noise[i]})
    return recs


def _selection() -> dict[str, object]:
    q = {"same_class_share": 0.1, "same_class_of_emoji": 0.2, "same_emoji_of_emoji": 0.05, "emoji_share": 0.5,
         "clipart_share": 0.5, "queries_with_same_class": 0.4, "chance_same_class": 0.03, "depth": 5, "queries": 9}
    return {"shift": "fluent3d", "fraction": 0.3, "seeds": [0], "source_top1": 0.3,
            "quality": {"twitter": {"efficientnet_lite0": {"5": q, "25": q}}}, "retriever": "efficientnet_lite0",
            "lr": {"tent": 1e-3, "shot-im": 1e-3, "adacontrast": 1e-3, "t3ar-noretrieval": 1e-3},
            "train_lr": {"supervised": 1e-3, "t3ar-noretrieval": 1e-3},
            "lr_table": [{"method": "tent", "mode": "test", "lr": 1e-3, "top1": 0.31}],
            "bn_groups": 2, "bn_table": [{"train_groups": 2, "top1": 0.33}], "term": {"temperature": 0.5},
            "term_table": [{"setting": {}, "top1": 0.3}, {"setting": {"temperature": 0.5}, "top1": 0.31}],
            "options": {"pool_data_weight": 1.0}, "paper_top1": 0.31, "validated_top1": 0.32,
            "validated_beats_paper": True,
            "options_table": [{"option": "neighbours as data", "top1": 0.32, "base_top1": 0.31, "kept": True}],
            "validated": {"method": "t3ar", "options": {"temperature": 0.5, "pool_data_weight": 1.0}}}


def _selection_labelled() -> dict[str, object]:
    return {**_selection(), "family_options": {},
            "labelled": {"options": {"temperature": 0.5, "pool_data_weight": 1.0, "pool_label_weight": 1.0}}}


def test_grid_verdict_follows_the_paired_effects() -> None:
    good = summarise_grid(QUICK, _selection(), _grid_records(0.04, [0.001, -0.001]))
    assert good["verdict"]["met"] is True
    assert math.isclose(good["retrieval_alone"]["test"]["0.3"]["mean"], 0.04, abs_tol=1e-9)
    assert set(good["retrieval_alone"]["train"]["0.3"]) == {"mean", "lo", "hi"}
    assert math.isclose(good["vs_bn_adapt"]["test"]["0.3"]["mean"], 0.06, abs_tol=1e-9)  # 0.39 - 0.33
    assert good["pool_data"]["test"]["0.3"]["per_step"] == 6.0
    weak = summarise_grid(QUICK, _selection(), _grid_records(0.01, [0.02, -0.02], bn=0.34))
    failed = [c["check"] for c in weak["verdict"]["checks"] if not c["met"]]
    assert weak["verdict"]["met"] is False and any("retrieval alone" in c for c in failed)
    assert any("bn-adapt ≥ 3 points" in c for c in failed)  # 0.36 - 0.34: 2 points
    strong_bn = summarise_grid(QUICK, _selection(), _grid_records(0.04, [0.0, 0.0], bn=0.40))
    checks = {c["check"]: c for c in strong_bn["verdict"]["checks"]}
    assert not checks["test-time 30 %: validated T3AR ≥ the best other method (bn-adapt)"]["met"]


def test_grid_flags_methods_below_source() -> None:
    recs = _grid_records(0.04, [0.0, 0.0])
    for r in recs:
        if r["label"] == "tent":
            r["top1"] = 0.1
    checks = {c["check"]: c for c in summarise_grid(QUICK, _selection(), recs)["verdict"]["checks"]}
    below = checks["no method below source-only on average"]
    assert below["met"] is False and ("tent", 0.3) in below["value"]
    assert checks["T3AR below source-only on no shift"]["met"] is True


def test_grid_arms_pair_the_family_and_label_every_arm() -> None:
    import dataclasses

    # the grid without the labelled protocol (test_bench_labelled.py covers its arms)
    arms = grid_arms(dataclasses.replace(QUICK, labelled=False, grid_skip=()), _selection())
    labels = {a["label"] for a in arms}
    assert labels == {"bn-adapt", "tent", "shot-im", "adacontrast", "t3ar-noretrieval", "t3ar-paper", "t3ar", ORACLE,
                      "supervised"}
    cell = [a for a in arms if a["shift"] == "twitter" and a["seed"] == 0 and a["phase"] == "main"
            and a["label"] != ORACLE]
    fam = {a["label"]: a for a in cell if a["label"].startswith("t3ar")}
    # the family shares lr and term: the validated T3AR differs from its twin by retrieval alone
    assert {a["lr"] for a in fam.values()} == {1e-3}
    assert fam["t3ar-noretrieval"]["options"] == {"temperature": 0.5} == fam["t3ar-paper"]["options"]
    assert fam["t3ar"]["options"] == {"temperature": 0.5, "pool_data_weight": 1.0}
    oracle = [a for a in arms if a["label"] == ORACLE]
    assert all(a["oracle_pool_labels"] and a["options"]["pool_data_weight"] > 0 for a in oracle)


def test_plans_are_consistent() -> None:
    for plan in PLANS.values():
        assert set(plan.low_fractions) <= set(plan.fractions)
        assert plan.ablation_fraction in plan.fractions and plan.select_fraction in plan.fractions
        # choices are never made on evaluation shifts
        assert not set(grid_plans.validation_shifts(plan)) & set(plan.eval_shifts)
        assert set(plan.select_seeds) <= set(plan.seeds)
    cpu = PLANS["cpu"]
    assert len(cpu.seeds) >= 3 and len(cpu.eval_shifts) >= 8 and len(grid_plans.validation_shifts(cpu)) >= 2
    assert set(cpu.fractions) == {0.1, 0.3} and cpu.holdout_per_class == (1, 2, 4)
    assert len(PLANS["paper"].seeds) >= 5 and PLANS["paper"].epochs == 30


def test_the_cpu_plans_shifts_are_every_style_outside_the_source_and_validation_families() -> None:
    from t3ar.datakit.archive import ARCHIVE_STYLES, family_of
    from t3ar.datakit.emoji import DEFAULT_STYLES
    from t3ar_bench.method.labelled_pool import ARCHIVE_POOL_STYLES

    cpu = PLANS["cpu"]
    held = {family_of("google")} | {family_of(v) for v in grid_plans.validation_shifts(cpu)}
    # every kit style and every archive style of the labelled pool (one per artwork: the archive's twemoji and
    # openmoji-iconify are the kit's twitter and openmoji) outside those families is an evaluation shift
    styles = [*DEFAULT_STYLES, *ARCHIVE_POOL_STYLES]
    assert sorted(cpu.eval_shifts) == sorted(s for s in styles if family_of(s) not in held)
    assert "openmoji-black" in cpu.eval_shifts  # line art included
    assert all(family_of(s) not in held for s in cpu.eval_shifts)
    # one validation shift where the base model is usable (3-D colour), one where it is weak (monochrome)
    assert grid_plans.validation_shifts(cpu) == ("fluent3d", "fluent-emoji-high-contrast")
    assert {family_of(v) for v in grid_plans.validation_shifts(cpu)} == {"fluent"}
    assert "twemoji" not in cpu.eval_shifts and "openmoji-iconify" not in cpu.eval_shifts
    assert all(s in ARCHIVE_STYLES or s in DEFAULT_STYLES for s in cpu.eval_shifts)


def test_the_quick_plan_stays_small() -> None:
    """quick is a smoke run of minutes: one shift, two seeds, one fraction, a short schedule, a capped target."""
    q = PLANS["quick"]
    assert len(q.eval_shifts) == 1 and len(grid_plans.validation_shifts(q)) == 1 and len(q.seeds) <= 2
    assert q.fractions == (0.3,) and q.max_steps is not None and q.max_steps <= 8
    assert q.max_adapt is not None and q.max_adapt <= 200 and q.max_eval is not None and q.max_eval <= 300
    assert q.pool_cap is not None and q.pool_cap <= 200 and q.source_epochs == 1 and len(q.lr_grid) == 1
    assert len(grid_arms(q, _selection_labelled())) <= 30


def test_grid_report_renders(tmp_path: Path) -> None:
    from t3ar_bench.method.grid_report import render_grid

    plan = QUICK
    recs = _grid_records(0.04, [0.001, -0.001])
    curve = {"epoch": 1.0, "loss": 1.0, "loss_ce": 0.5, "loss_contrastive": 0.5, "loss_diversity": 0.0,
             "pl_accuracy": 0.4, "pool_neg_share": 0.2, "grad_norm_ce": 0.1, "grad_norm_contrastive": 0.2,
             "pl_change_rate": 0.0, "lr": 0.001, "pool_data_count": 5.0, "pool_data_correct": 0.7}
    summary = summarise_grid(plan, _selection(), recs)
    recs.append({"phase": "main", "label": "t3ar", "shift": "twitter", "seed": 0, "fraction": 0.3, "method": "t3ar",
                 "top1": 0.39, "curves": [curve, {**curve, "epoch": 2.0}]})
    res = {"plan": plan.as_dict(), "device": "cpu", "device_name": "x86", "minutes": {"total": 1.0},
           "runs_executed": 3, "runs_cached": 0, "run_seconds_total": 60.0, "selection": _selection(),
           "records": recs, "targets": {"twitter": {"adapt": 160, "eval": 240, "classes": 96}}, **summary}
    text = render_grid(res, "adaptation-quick")
    for heading in ("## Verdict", "## Protocol", "## Choices made on the validation shift", "## Retrieval quality",
                    "## Test-time results", "## Train-time results", "## Neighbours as data",
                    "## Per-epoch diagnostics"):
        assert heading in text
    assert "**Goal met.**" in text and "48 img" in text
    assert "| **retrieval alone**: validated T3AR − T3AR without retrieval (its retrieval-off twin) | +4.0 [" in text
    assert "| test | 30 % | 6.0 | 3.0 | 70.0 % |" in text
    assert "it becomes the product's default `t3ar` configuration" in text
    # an arm the plan skips (here the paper-faithful one) leaves no row of NaNs
    assert "| validated T3AR − paper-faithful T3AR |" in text
    nan = {"n": 2, "mean": math.nan, "lo": math.nan, "hi": math.nan}
    skipped = {**res, "vs_paper": {mode: {f: nan for f in by_f} for mode, by_f in res["vs_paper"].items()}}
    text = render_grid(skipped, "adaptation-quick")
    assert "paper-faithful T3AR |" not in text and "nan" not in text


def test_interleaved_runs_steps_in_lock_step() -> None:
    from t3ar.method.adapt import StepStats
    from t3ar_bench.speed.main import interleaved

    order: list[str] = []

    def loop(name: str, steps: int) -> Callable[[Callable[[StepStats], None]], None]:
        def run(on_step: Callable[[StepStats], None]) -> None:
            for i in range(steps):
                order.append(name)
                on_step(StepStats(1, i + 1, steps, 0.0, 0.0))
        return run

    out = interleaved({"a": loop("a", 3), "b": loop("b", 2), "c": loop("c", 3)})
    assert order == ["a", "b", "c", "a", "b", "c", "a", "c"]
    assert [len(out[n][0]) for n in "abc"] == [2, 1, 2]  # the first step of each run is dropped
    assert all(w >= 0 for n in "abc" for w in out[n][0])


def test_interleaved_reraises_and_finishes_the_others() -> None:
    from t3ar.method.adapt import StepStats
    from t3ar_bench.speed.main import interleaved

    finished: list[str] = []

    def bad(on_step: Callable[[StepStats], None]) -> None:
        raise RuntimeError("boom")

    def good(on_step: Callable[[StepStats], None]) -> None:
        for i in range(3):
            on_step(StepStats(1, i + 1, 3, 0.0, 0.0))
        finished.append("good")

    with pytest.raises(RuntimeError, match="boom"):
        interleaved({"bad": bad, "good": good})
    assert finished == ["good"]


def test_drift_report_renders(tmp_path: Path) -> None:
    from t3ar_bench.method.plans import DRIFT
    from t3ar_bench.method.report import write_drift_report

    curve = {"epoch": 1.0, "loss": 1.0, "loss_ce": 0.5, "loss_contrastive": 4.0, "loss_diversity": 0.0,
             "pl_accuracy": 0.4, "pool_neg_share": 0.2, "grad_norm_ce": 0.1, "grad_norm_contrastive": 0.2,
             "pl_change_rate": 0.0, "lr": 0.001}
    rec = {"phase": "drift", "shift": "twitter", "seed": 0, "fraction": 0.3, "method": "t3ar", "lr": 1e-3,
           "top1": 0.35, "curves": [curve, {**curve, "epoch": 2.0, "pl_accuracy": 0.3}],
           "eval_curve": [{"epoch": 1.0, "step": 7.0, "top1": 0.45}, {"epoch": 2.0, "step": 14.0, "top1": 0.35}]}
    res = {"plan": DRIFT.as_dict(), "device": "cpu", "records": [rec], "source_top1": {"twitter/0": 0.43},
           "minutes": 1.0}
    write_drift_report(res, tmp_path, stem="adaptation-drift")
    text = (tmp_path / "adaptation-drift.md").read_text()
    assert "| T3AR | 0.001 | 43.0 | 1 (45.0) | 35.0 | 40.0 → 30.0 |" in text
    # the reading is computed: a run that ends below the source model is called out as fitting its own labels
    assert "T3AR, lr 0.001: peaks at epoch 1 (45.0 %), then falls to 35.0 % (-8.0 points" in text
    assert "most of them wrong" in text
    assert (tmp_path / "adaptation-drift-curves.png").stat().st_size > 1000


def test_run_cache_key_depends_on_run_affecting_plan_fields_only() -> None:
    import dataclasses
    from types import SimpleNamespace

    from t3ar_bench.method.plans import PAPER
    from t3ar_bench.method.runs import arm_key

    tgt = SimpleNamespace(style=SimpleNamespace(items=["a", "b", "c"]), adapt_idx=[0, 1], eval_idx=[2])

    def key(plan: object, **arm: object) -> str:
        ctx = SimpleNamespace(plan=plan, code="c0", targets={"twitter": tgt}, sources={0: SimpleNamespace(sha256="s")})
        return arm_key(ctx, {"shift": "twitter", "seed": 0, "method": "t3ar", "lr": 1e-3, **arm})  # type: ignore[arg-type]

    base = key(PAPER)
    # which runs a plan makes does not change a run: a plan with fewer fractions or seeds reuses the runs
    assert key(dataclasses.replace(PAPER, fractions=(0.1, 0.3), seeds=(0,), workers=3, name="x")) == base
    assert key(dataclasses.replace(PAPER, epochs=5)) != base  # how a run is made does
    assert key(dataclasses.replace(PAPER, k=3)) != base
    assert key(PAPER, lr=2e-4) != base


def test_fractions_option_restricts_a_plan() -> None:
    import click

    from t3ar_bench.method.command import _only_fractions
    from t3ar_bench.method.plans import PAPER

    low = _only_fractions(PAPER, "0.1,0.3")
    assert low.fractions == low.low_fractions == low.train_fractions == (0.1, 0.3)
    assert low.seeds == PAPER.seeds and low.epochs == PAPER.epochs
    for bad in ("0.1", "0.5", "x", ""):  # 0.1 alone drops the 0.3 choice/ablation cell
        with pytest.raises(click.BadParameter):
            _only_fractions(PAPER, bad)


def _fake_top1(arm: dict[str, Any]) -> float:
    """A made-up validation landscape: lr 1e-3 best for all; in test mode the no-retrieval variant gains most at
    τ 0.5 (and some at weight 0.3), T3AR at τ 0.2; the random ablation and train mode gain from no change; the
    redraw option adds on top of anything."""
    opts = dict(arm.get("options", {}))
    gains = {("t3ar-noretrieval", "temperature", 0.5): 0.02, ("t3ar-noretrieval", "contrastive_weight", 0.3): 0.01,
             ("t3ar", "temperature", 0.2): 0.02}
    gain = 0.0 if arm.get("mode") == "train" else sum(gains.get((arm["method"], k, v), 0.0) for k, v in opts.items())
    return 0.5 - abs(float(arm["lr"]) - 1e-3) + gain + (0.03 if "redraw_neighbours" in opts else 0.0)


def _fake_run_all(ran: list[dict[str, Any]]) -> Callable[..., list[dict[str, Any]]]:
    def run_all(ctx: object, arms: list[dict[str, Any]], cache: object, *a: object) -> list[dict[str, Any]]:
        ran.extend(arms)
        return [{**arm, "top1": _fake_top1(arm)} for arm in arms]
    return run_all


def _grid_top1(arm: dict[str, Any]) -> float:
    """A made-up validation landscape for the grid protocol: lr 1e-3 best everywhere; the family gains at τ 0.5;
    T3AR gains from neighbours as data only when restricted to the emoji sources, and from masking false negatives;
    r = 1 costs; bn-adapt is best on every layer; R lite1 is the default's equal (never run differently here)."""
    opts = dict(arm.get("options", {}))
    top = 0.5 - abs(float(arm["lr"]) - 1e-3) + (0.02 if opts.get("temperature") == 0.5 else 0.0)
    if arm["method"] == "t3ar":
        top += 0.02 if opts.get("pool_data_sources") else 0.0
        top += {"mask": 0.01, "positive": 0.0}.get(opts.get("false_negatives", ""), 0.0)
        top -= 0.01 if opts.get("r") == 1 else 0.0
    if arm["method"] == "bn-adapt":
        top += 0.01 if opts.get("train_groups") is None else 0.0
    return top


def test_grid_selection_freezes_each_choice_on_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses
    from types import SimpleNamespace

    import t3ar_bench.method.grid as grid
    from t3ar_bench.method.plans import CPU

    plan = dataclasses.replace(CPU, retrievers=("efficientnet_lite0", "efficientnet_lite1"))
    ran: list[dict[str, Any]] = []

    def run_all(ctx: object, arms: list[dict[str, Any]], cache: object, *a: object) -> list[dict[str, Any]]:
        ran.extend(arms)
        return [{**arm, "top1": _grid_top1(arm)} for arm in arms]

    q = {"same_class_share": 0.1}
    better = {**q, "same_class_share": 0.2}
    table = {plan.validation_shift: {"efficientnet_lite0": {"5": q}, "efficientnet_lite1": {"5": better}}}
    monkeypatch.setattr(grid, "run_all", run_all)
    hold = {"1": {"top1": 0.5, "n": 2, "correct": [True, False]}}
    monkeypatch.setattr(grid, "source_record", lambda ctx, shift, seed, fraction=None:
                        {"top1": 0.4, **({"holdout": hold} if fraction else {})})
    monkeypatch.setattr(grid, "quality_table", lambda ctx: table)
    sel = grid.select_design(SimpleNamespace(plan=plan), Path("."))  # type: ignore[arg-type]
    # nothing runs on an evaluation shift; every validation shift is run
    assert {a["shift"] for a in ran} == set(grid_plans.validation_shifts(plan)) == {"fluent3d",
                                                                                     "fluent-emoji-high-contrast"}
    assert sel["retriever"] == "efficientnet_lite1" and sel["bn_groups"] is None
    assert set(sel["lr"].values()) == {1e-3} and sel["term"] == {"temperature": 0.5}
    assert sel["options"] == {"pool_data_weight": 1.0, "pool_data_sources": list(grid_plans.EMOJI_SOURCES),
                              "false_negatives": "mask"}
    kept = [r["option"] for r in sel["options_table"] if r["kept"]]
    assert kept == ["retriever efficientnet_lite1 (by retrieval quality)",
                    "neighbours as data from the emoji sources only", "false negatives masked"]
    assert sel["validated"] == {"method": "t3ar", "retriever": "efficientnet_lite1",
                                "options": {"temperature": 0.5, **sel["options"]}}
    assert sel["validated_beats_paper"] and sel["validated_top1"] > sel["paper_top1"]
    # the winner rule is chosen on the validation cells: here the adapted runs have no holdout, so no cell is
    # decided and the product's default stays
    wr = sel["winner_rule"]
    assert wr["shifts"] == sorted(grid_plans.validation_shifts(plan)) and wr["chosen"] == wr["default"]
    assert {t["cells"] for t in wr["table"]} == {0}


def test_contrastive_study_arms_summary_and_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses
    from types import SimpleNamespace

    import t3ar_bench.method.main as bm
    from t3ar_bench.method.contrastive_study import study_arms, summarise_study, write_contrastive_report
    from t3ar_bench.method.plans import CONTRASTIVE_STUDY

    plan = dataclasses.replace(CONTRASTIVE_STUDY, eval_shifts=("twitter", "openmoji"), seeds=(0, 1, 2),
                               lr_grid=(1e-3,))
    ran: list[dict[str, Any]] = []
    monkeypatch.setattr(bm, "run_all", _fake_run_all(ran))
    monkeypatch.setattr(bm, "source_record", lambda ctx, shift, seed: {"top1": 0.4})
    sel = bm.select(SimpleNamespace(plan=plan), Path("."))  # type: ignore[arg-type]
    # validation arms are the selection's own (one run cache with the other plans); no train-time choices here
    assert {a["phase"] for a in ran} == {"select"} and sel["train_contrastive"] == {}
    arms = study_arms(plan, sel)
    per_cell = [a for a in arms if a["shift"] == "twitter" and a["seed"] == 0]
    # CE only; both at the default; no retrieval at τ 0.5 (its choice) and at τ 0.2 (T3AR's); T3AR at τ 0.2 once
    assert sorted((a["method"], tuple(sorted(a.get("options", {}).items()))) for a in per_cell) == [
        ("t3ar", ()), ("t3ar", (("temperature", 0.2),)), ("t3ar-noretrieval", ()),
        ("t3ar-noretrieval", (("contrastive_weight", 0.0),)), ("t3ar-noretrieval", (("temperature", 0.2),)),
        ("t3ar-noretrieval", (("temperature", 0.5),))]
    assert len(arms) == 6 * 2 * 3 and {a["phase"] for a in arms} == {"contrastive"}
    # made-up accuracies: CE only 0.40; the default term costs 2 points; τ 0.5 costs 1; τ 0.2 costs 1, and there
    # retrieval gives 1.5 points back
    def top1(a: dict[str, Any]) -> float:
        o = a.get("options", {})
        if o.get("contrastive_weight") == 0.0:
            acc = 0.40
        elif not o:
            acc = 0.38
        else:
            acc = 0.39 + (0.015 if a["method"] == "t3ar" and o.get("temperature") == 0.2 else 0.0)
        return acc + 0.001 * int(a["seed"])
    recs = [{**a, "top1": top1(a)} for a in arms]
    res = summarise_study(plan, sel, recs)
    assert math.isclose(res["ce_only"]["mean"], 0.401)
    assert math.isclose(res["default"]["retrieval_gain"]["mean"], 0.0, abs_tol=1e-9)
    assert math.isclose(res["t3ar_choice"]["retrieval_gain"]["mean"], 0.015, abs_tol=1e-9)
    assert math.isclose(res["chosen"]["retrieval_gain"]["mean"], 0.015, abs_tol=1e-9)
    assert math.isclose(res["default"]["t3ar"]["minus_ce_only"]["mean"], -0.02, abs_tol=1e-9)
    assert res["chosen"]["t3ar-noretrieval"]["setting"] == "τ 0.5" and res["default"]["t3ar"]["setting"] == "default"
    recs = [{**r, "seconds": 60.0} for r in recs]
    full = {"plan": plan.as_dict(), "device": "cpu", "selection": sel, "records": recs, "minutes": 1.0,
            "runs_executed": len(recs), "source_top1": {"twitter/0": 0.3}, "n_adapt": {"twitter": 600}, **res}
    write_contrastive_report(full, tmp_path, stem="adaptation-contrastive")
    text = (tmp_path / "adaptation-contrastive.md").read_text()
    assert "| T3AR's choice for both (τ 0.2 / τ 0.2) | 39.1 | 40.6 | +1.5 [+1.5, +1.5] | -1.0 [-1.0, -1.0] | " \
           "+0.5 [+0.5, +0.5] |" in text
    assert "| t3ar | 50.0 | 50.0 | 50.0 | 52.0 | 50.0 | τ 0.2 |" in text  # validation: default first, then each change
    assert "- T3AR's choice for both: the 95 % CI of what retrieval adds above 0." in text
    assert (tmp_path / "adaptation-contrastive.png").stat().st_size > 1000


def test_the_emoji_sources_are_the_kits_styles_but_the_sources() -> None:
    from t3ar.datakit.emoji import DEFAULT_STYLES
    from t3ar_bench.method.plans import EMOJI_SOURCES
    from t3ar_bench.method.protocol import SOURCE_STYLE

    assert set(EMOJI_SOURCES) == set(DEFAULT_STYLES) - {SOURCE_STYLE}

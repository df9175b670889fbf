"""The pure parts of `t3ar bench adapt`: split and subsets, retrieval diagnostics, paired statistics, the
summary and its verdict, the report."""

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from t3ar.bench.method.main import summarise
from t3ar.bench.method.plans import PLANS, QUICK, paired, t_quantile
from t3ar.bench.method.protocol import (
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


def _records(t3ar_gain: float, noise: list[float]) -> list[dict[str, object]]:
    """A fake main/train grid on the quick plan: T3AR = no-retrieval + gain (+ per-seed noise)."""
    plan = QUICK
    base = {"source": 0.30, "tent": 0.31, "shot-im": 0.33, "adacontrast": 0.34, "t3ar-noretrieval": 0.35,
            "t3ar-random": 0.345, "supervised": 0.36}
    recs: list[dict[str, object]] = []
    for shift in plan.eval_shifts:
        for i, seed in enumerate(plan.seeds):
            for f in set(plan.fractions) | set(plan.train_fractions):
                for m, acc in base.items():
                    if m == "supervised":
                        continue
                    recs.append({"phase": "source" if m == "source" else "main", "shift": shift, "seed": seed,
                                 "fraction": f, "method": m, "top1": acc})
                recs.append({"phase": "main", "shift": shift, "seed": seed, "fraction": f, "method": "t3ar",
                             "top1": base["t3ar-noretrieval"] + t3ar_gain + noise[i]})
                for m in plan.train_methods:
                    acc = base.get(m, 0.35) + (t3ar_gain + noise[i] if m == "t3ar" else 0.0)
                    recs.append({"phase": "train", "shift": shift, "seed": seed, "fraction": f, "method": m,
                                 "top1": acc})
    return recs


def test_summary_verdict_follows_the_paired_effect() -> None:
    good = summarise(QUICK, _records(0.04, [0.001, -0.001]))
    assert good["verdict"]["met"] is True
    assert math.isclose(good["diffs"]["0.3"]["t3ar-noretrieval"]["mean"], 0.04, abs_tol=1e-9)
    weak = summarise(QUICK, _records(0.01, [0.02, -0.02]))  # a small, noisy effect: CI spans 0, < 3 points
    failed = [c["check"] for c in weak["verdict"]["checks"] if not c["met"]]
    assert weak["verdict"]["met"] is False and any("CI above 0" in c for c in failed)
    assert any("+ 3 points" in c for c in failed)


def test_summary_flags_methods_below_source() -> None:
    recs = _records(0.04, [0.0, 0.0])
    for r in recs:
        if r["method"] == "tent":
            r["top1"] = 0.1
    checks = {c["check"]: c for c in summarise(QUICK, recs)["verdict"]["checks"]}
    below = checks["no adapted method below source-only on average"]
    assert below["met"] is False and ("tent", 0.3) in below["value"]
    assert checks["T3AR below source-only on no shift"]["met"] is True


def test_plans_are_consistent() -> None:
    for plan in PLANS.values():
        assert set(plan.low_fractions) <= set(plan.fractions)
        assert plan.ablation_fraction in plan.fractions and plan.select_fraction in plan.fractions
        assert plan.validation_shift not in plan.eval_shifts  # choices are never made on evaluation shifts
        assert set(plan.select_seeds) <= set(plan.seeds) and plan.methods[0] == "source"
    assert len(PLANS["cpu"].seeds) >= 5 and len(PLANS["paper"].seeds) >= 5 and PLANS["paper"].epochs == 30


def test_report_renders(tmp_path: Path) -> None:
    from t3ar.bench.method.report import render

    plan = QUICK
    recs = _records(0.04, [0.001, -0.001])
    recs.append({"phase": "ablation", "variant": "k=1", "shift": "twitter", "seed": 0, "fraction": 0.3,
                 "method": "t3ar", "top1": 0.36})
    curve = {"epoch": 1.0, "loss": 1.0, "loss_ce": 0.5, "loss_contrastive": 0.5, "loss_diversity": 0.0,
             "pl_accuracy": 0.4, "pool_neg_share": 0.2, "grad_norm_ce": 0.1, "grad_norm_contrastive": 0.2,
             "pl_change_rate": 0.0, "lr": 0.001}
    recs.append({"phase": "main", "shift": "twitter", "seed": 0, "fraction": 0.3, "method": "t3ar", "top1": 0.39,
                 "curves": [curve, {**curve, "epoch": 2.0}], "curves_only": True})
    summary = summarise(plan, [r for r in recs if not r.get("curves_only")])
    sel = {"lr": {m: 1e-3 for m in plan.methods if m != "source"}, "train_lr": {m: 1e-3 for m in plan.train_methods},
           "t3ar_options": {}, "lr_table": [{"method": "t3ar", "mode": "test", "lr": 1e-3, "top1": 0.4}],
           "options_table": [{"option": "pool_negatives", "value": "all", "top1": 0.39, "base_top1": 0.4,
                              "kept": False}], "source_top1": 0.3}
    res = {"plan": plan.as_dict(), "device": "cpu", "device_name": "x86", "minutes": {"total": 1.0},
           "runs_executed": 3, "runs_cached": 0, "selection": sel, "records": recs,
           "targets": {"twitter": {"adapt": 160, "eval": 240, "classes": 96}}, **summary}
    text = render(res, "adaptation-quick")
    for heading in ("## Verdict", "## Protocol", "## Choices made on the validation shift", "## Test-time results",
                    "## Train-time results", "## Ablations", "## Stability"):
        assert heading in text
    assert "**Goal met.**" in text and "| k=1 | 36.0 |" in text and "48 img, 0.5/class" in text
    assert "retrieval alone" not in text  # no retrieval-off arms in these records: no line


def test_retrieval_alone_is_paired_against_t3ars_own_configuration() -> None:
    from t3ar.bench.method.plans import RETRIEVAL_OFF
    from t3ar.bench.method.report import retrieval_alone_lines

    plan = QUICK
    recs = _records(0.04, [0.001, -0.001])  # T3AR 0.391 / 0.389 at every shift and fraction
    recs += [{"phase": "ablation", "variant": RETRIEVAL_OFF, "shift": sh, "seed": s, "fraction": 0.3,
              "method": "t3ar-noretrieval", "top1": 0.38} for sh in plan.eval_shifts for s in plan.seeds]
    summary = summarise(plan, recs)
    alone = summary["retrieval_alone"]
    assert alone["fraction"] == 0.3 and alone["n"] == len(plan.seeds)
    assert alone["diffs"] == pytest.approx([0.011, 0.009]) and math.isclose(alone["mean"], 0.01)
    # the check still compares the frozen arms: 4 points, not the 1 point retrieval adds alone
    assert math.isclose(summary["diffs"]["0.3"]["t3ar-noretrieval"]["mean"], 0.04, abs_tol=1e-9)
    sel = {"lr": {"t3ar": 2e-4, "t3ar-noretrieval": 1e-3}, "contrastive": {"t3ar": {"temperature": 0.5}}}
    text = "\n".join(retrieval_alone_lines({"selection": sel, **summary}))
    assert "**retrieval alone** at 30 %" in text and "+1.0 [" in text
    assert "froze them apart (T3AR: lr 0.0002, τ 0.5; T3AR without retrieval: lr 0.001, the default" in text
    same = {"lr": {"t3ar": 1e-3, "t3ar-noretrieval": 1e-3}}
    assert "froze them apart" not in "\n".join(retrieval_alone_lines({"selection": same, **summary}))
    assert summarise(plan, _records(0.04, [0.0, 0.0]))["retrieval_alone"] is None


def test_interleaved_runs_steps_in_lock_step() -> None:
    from t3ar.bench.speed.main import interleaved
    from t3ar.method.adapt import StepStats

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
    from t3ar.bench.speed.main import interleaved
    from t3ar.method.adapt import StepStats

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
    from t3ar.bench.method.plans import DRIFT
    from t3ar.bench.method.report import write_drift_report

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

    from t3ar.bench.method.plans import PAPER
    from t3ar.bench.method.runs import arm_key

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

    from t3ar.bench.method.command import _only_fractions
    from t3ar.bench.method.plans import PAPER

    low = _only_fractions(PAPER, "0.1,0.3")
    assert low.fractions == low.low_fractions == low.train_fractions == (0.1, 0.3)
    assert low.seeds == PAPER.seeds and low.epochs == PAPER.epochs
    for bad in ("0.1", "0.5", "x", ""):  # 0.1 alone drops the 0.3 choice/ablation cell
        with pytest.raises(click.BadParameter):
            _only_fractions(PAPER, bad)


def test_approximations_are_ablation_arms_paired_with_the_frozen_t3ar() -> None:
    from t3ar.bench.method.main import main_arms
    from t3ar.bench.method.plans import APPROXIMATION
    from t3ar.bench.method.report import approximation_diffs

    plan = QUICK
    assert ("cpu_bf16_nograd", True) in plan.approximations and not PLANS["paper"].approximations
    sel = {"lr": {m: 1e-3 for m in plan.methods if m != "source"}, "train_lr": {m: 1e-3 for m in plan.train_methods},
           "t3ar_options": {"pool_negatives": "all"}}
    approx = [a for a in main_arms(plan, sel) if str(a.get("variant", "")).startswith(APPROXIMATION)]
    assert len(approx) == len(plan.eval_shifts) * len(plan.seeds)
    # on top of the frozen choice, never instead of it; never part of a choice or of the main grid
    assert all(a["options"] == {"pool_negatives": "all", "cpu_bf16_nograd": True} and a["phase"] == "ablation"
               and a["fraction"] == plan.ablation_fraction for a in approx)
    recs = [{"phase": "main", "shift": "twitter", "seed": s, "fraction": 0.3, "method": "t3ar", "top1": t}
            for s, t in ((0, 0.40), (1, 0.42))]
    recs += [{"phase": "ablation", "variant": f"{APPROXIMATION}cpu_bf16_nograd", "shift": "twitter", "seed": s,
              "fraction": 0.3, "method": "t3ar", "top1": t} for s, t in ((0, 0.39), (1, 0.42))]
    d = approximation_diffs(recs, 0.3)["cpu_bf16_nograd"]
    assert d["n"] == 2 and math.isclose(d["mean"], -0.005) and d["diffs"] == pytest.approx([-0.01, 0.0])


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


def test_selection_chooses_the_contrastive_setting_per_method_and_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses
    from types import SimpleNamespace

    import t3ar.bench.method.main as bm
    from t3ar.bench.method.plans import CE_ONLY, PAPER, RETRIEVAL_OFF

    plan = dataclasses.replace(PAPER, lr_grid=(2e-4, 1e-3))
    ran: list[dict[str, Any]] = []
    monkeypatch.setattr(bm, "run_all", _fake_run_all(ran))
    monkeypatch.setattr(bm, "source_record", lambda ctx, shift, seed: {"top1": 0.4})
    sel = bm.select(SimpleNamespace(plan=plan), Path("."))  # type: ignore[arg-type]
    assert sel["lr"]["t3ar"] == 1e-3
    assert sel["contrastive"] == {"t3ar-noretrieval": {"temperature": 0.5}, "t3ar-random": {},
                                  "t3ar": {"temperature": 0.2}}
    assert sel["train_contrastive"] == {"t3ar-noretrieval": {}, "t3ar-random": {}, "t3ar": {}}  # ties keep it
    # the default is the lr grid's own run (no extra arm); each other setting runs once per method, mode and seed
    setting_arms = [a for a in ran if a["phase"] in ("select", "select-train") and a.get("options")]
    assert len(setting_arms) == len(plan.contrastive_settings) * 6 * len(plan.select_seeds)
    # T3AR's options are tried on top of its chosen setting, and kept only if they beat that base
    opts = [a for a in ran if a["phase"] == "select-option"]
    assert opts and all(a["options"]["temperature"] == 0.2 for a in opts)
    assert sel["t3ar_options"] == {"redraw_neighbours": True}
    chosen = {(r["method"], r["mode"]): r["setting"] for r in sel["contrastive_table"] if r["chosen"]}
    assert chosen[("t3ar", "test")] == "τ 0.2" and chosen[("t3ar", "train")] == "default"
    assert len(sel["contrastive_table"]) == 6 * (1 + len(plan.contrastive_settings))
    # the frozen arms carry the chosen settings; the cross-entropy-only ablation arm is there once per cell
    arms = bm.main_arms(plan, sel)
    main = {a["method"]: a.get("options") for a in arms if a["phase"] == "main" and a["fraction"] == 0.3
            and a["shift"] == "twitter" and a["seed"] == 0}
    assert main["t3ar"] == {"redraw_neighbours": True, "temperature": 0.2}
    assert main["t3ar-noretrieval"] == {"temperature": 0.5} and main["t3ar-random"] == {"redraw_neighbours": True}
    assert main["shot-im"] is None  # other methods: no options key (their cached runs stay valid)
    train = [a for a in arms if a["phase"] == "train" and a["method"] == "t3ar-noretrieval"]
    assert train and all("options" not in a for a in train)
    ce = [a for a in arms if a.get("variant") == CE_ONLY]
    assert len(ce) == len(plan.eval_shifts) * len(plan.seeds)
    assert all(a["method"] == "t3ar-noretrieval" and a["options"] == {"contrastive_weight": 0.0} for a in ce)
    assert {a["options"]["temperature"] for a in arms if a.get("variant") in ("k=1", "oracle: no same-class "
                                                                                      "neighbours")} == {0.2}
    # retrieval alone: the no-retrieval method at T3AR's lr and contrastive term (not T3AR's pool options)
    off = [a for a in arms if a.get("variant") == RETRIEVAL_OFF]
    assert len(off) == len(plan.eval_shifts) * len(plan.seeds)
    assert all(a["method"] == "t3ar-noretrieval" and a["lr"] == sel["lr"]["t3ar"]
               and a["options"] == {"temperature": 0.2} and a["fraction"] == plan.ablation_fraction for a in off)


def test_contrastive_study_arms_summary_and_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses
    from types import SimpleNamespace

    import t3ar.bench.method.main as bm
    from t3ar.bench.method.contrastive_study import study_arms, summarise_study, write_contrastive_report
    from t3ar.bench.method.plans import CONTRASTIVE_STUDY

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

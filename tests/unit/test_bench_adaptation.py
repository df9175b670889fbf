"""The pure parts of `t3ar bench adapt`: protocol split and subsets, aggregation, diagnostics, the verdict."""

import math
from collections.abc import Callable

import pytest

from t3ar.bench.adaptation_protocol import (
    AVERAGE,
    FULL,
    QUICK,
    aggregate,
    cap_indices,
    fraction_size,
    fraction_subset,
    goal_verdict,
    lookup,
    mean_std,
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


def test_mean_std_is_sample_std() -> None:
    r = mean_std([0.5, 0.6, 0.7])
    assert r["n"] == 3 and math.isclose(r["mean"], 0.6) and math.isclose(r["std"], 0.1)
    assert mean_std([0.4]) == {"mean": 0.4, "std": 0.0, "n": 1}
    assert mean_std([])["n"] == 0


def _rec(method: str, shift: str, seed: int, top1: float, fraction: float = 0.1) -> dict[str, object]:
    return {"variant": "main", "method": method, "fraction": fraction, "shift": shift, "seed": seed, "top1": top1}


def test_aggregate_per_shift_and_average_over_seeds() -> None:
    recs = [_rec("t3ar", "a", 0, 0.5), _rec("t3ar", "a", 1, 0.7), _rec("t3ar", "b", 0, 0.3), _rec("t3ar", "b", 1, 0.5)]
    rows = aggregate(recs)
    a = lookup(rows, variant="main", method="t3ar", fraction=0.1, shift="a")
    assert a is not None and math.isclose(a["mean"], 0.6) and a["n"] == 2
    avg = lookup(rows, variant="main", method="t3ar", fraction=0.1, shift=AVERAGE)
    # per seed averages over shifts: 0.4 and 0.6 -> mean 0.5, sample std 0.1414
    assert avg is not None and math.isclose(avg["mean"], 0.5) and math.isclose(avg["std"], math.sqrt(0.02))
    assert avg["seeds"] == [0, 1] and avg["shifts"] == ["a", "b"]


def test_aggregate_average_uses_only_seeds_present_for_every_shift() -> None:
    recs = [_rec("tent", "a", 0, 0.5), _rec("tent", "a", 1, 0.9), _rec("tent", "b", 0, 0.3)]
    avg = lookup(aggregate(recs), variant="main", method="tent", fraction=0.1)
    assert avg is not None and avg["seeds"] == [0] and math.isclose(avg["mean"], 0.4)


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


def _grid(t3ar: dict[float, float], best: dict[float, float]) -> list[dict[str, object]]:
    recs = []
    for f in (0.01, 0.1, 1.0):
        recs += [_rec("t3ar", "a", 0, t3ar[f], f), _rec("shot-im", "a", 0, best[f], f),
                 _rec("t3ar-noretrieval", "a", 0, best[f] - 0.05, f), _rec("source", "a", 0, 0.3, f)]
    return recs


def test_goal_verdict() -> None:
    ok = goal_verdict(aggregate(_grid({0.01: 0.64, 0.1: 0.70, 1.0: 0.70}, {0.01: 0.60, 0.1: 0.66, 1.0: 0.72})))
    assert ok["met"] is True
    assert ok["checks"][0]["best_baseline"] == "shot-im" and math.isclose(ok["checks"][0]["gap"], 0.04)
    bad = goal_verdict(aggregate(_grid({0.01: 0.62, 0.1: 0.70, 1.0: 0.70}, {0.01: 0.60, 0.1: 0.66, 1.0: 0.72})))
    assert bad["met"] is False and [c["met"] for c in bad["checks"]] == [False, True, True]
    missing = goal_verdict(aggregate([_rec("t3ar", "a", 0, 0.5, 1.0)]))
    assert missing["met"] is None


def test_plans_are_consistent() -> None:
    for plan in (FULL, QUICK):
        assert set(plan.ablation_seeds) <= set(plan.seeds) | {0} and plan.ablation_fraction in plan.fractions
        assert plan.methods[0] == "source" and "t3ar" in plan.methods


def _fake_results() -> dict[str, object]:
    """A small, complete results dict (what run_adaptation_benchmark produces) without any training."""
    plan = QUICK.as_dict()
    recs: list[dict[str, object]] = []
    for f in plan["fractions"]:
        for i, m in enumerate(plan["methods"]):
            nb = {"same_label_fraction": 0.2, "same_item_fraction": 0.05, "known_fraction": 0.7} \
                if m.startswith("t3ar") else None
            recs.append({**_rec(m, "twitter", 0, 0.3 + 0.01 * i, f), "k": 5, "seconds_per_epoch": 1.0,
                         "neighbours": nb})
    for variant in ("k=1", "pool: clipart only", "retriever: random-init"):
        recs.append({**_rec("t3ar", "twitter", 0, 0.33, 0.1), "variant": variant, "neighbours": None})
    diag = {"shift": "twitter", "retriever": "imagenet", "pool_with_emoji": True, "depth": 25,
            **retrieval_diagnostics([["openmoji/1"]], ["a"], ["1"], {"openmoji/1": ("a", "1")}, ["a", "b"]).as_dict()}
    rows = aggregate(recs)
    return {"plan": plan, "quick": True, "device": "cpu", "records": recs, "aggregate": rows,
            "verdict": goal_verdict(rows), "diagnostics": [diag], "runs_executed": 3,
            "runs_reused": 0, "timings": {"total": 60.0}, "source_models": {"0": {"reused": True, "seconds": 5.0}},
            "machine": {"cpus": 2, "loadavg_start": [0.1, 0.2, 0.3], "loadavg_end": [0.1, 0.2, 0.3]},
            "data": {"classes": 96, "source_images": 1851, "targets": {"twitter": {"adapt": 160, "eval": 240}},
                     "pool_components": {"openclipart": 10, "tuxpaint": 10, "openmoji": 10}}}


def test_report_renders_every_section() -> None:
    from t3ar.bench.adaptation_report import render

    text = render(_fake_results(), "adaptation-quick")
    for heading in ("## Verdict", "## Protocol", "## Results", "## Ablations", "## Retrieval diagnostics",
                    "## Speed", "## Time spent"):
        assert heading in text
    assert "**The goal was NOT met**" in text and "Quick smoke run" in text
    assert "| T3AR | 36.0 | 36.0 | 36.0 |" in text  # t3ar is the 7th method: 0.3 + 0.06
    assert "source models trained earlier (seed 0: 5 s)" in text


def test_interleaved_runs_steps_in_lock_step() -> None:
    from t3ar.bench.speed import interleaved
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
    from t3ar.bench.speed import interleaved
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

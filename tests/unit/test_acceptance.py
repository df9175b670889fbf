"""The acceptance check's pure core: Wilson CIs, the paired bootstrap, the two winner rules and their ties."""

from __future__ import annotations

import numpy as np
import pytest

from t3ar.acceptance import (
    DEFAULT_RULE,
    as_record,
    decide,
    gain_refusal,
    paired_diff,
    simplicity_order,
    wilson,
)


def _vec(right: int, n: int) -> np.ndarray:
    return np.arange(n) < right


def test_wilson_known_values() -> None:
    # 8 of 10: the textbook Wilson interval (z = 1.96) is [0.490, 0.943]
    lo, hi = wilson(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-3) and hi == pytest.approx(0.9433, abs=1e-3)
    # the ends stay inside [0, 1] and are not degenerate at 0 and 100 %
    lo0, hi0 = wilson(0, 20)
    assert lo0 == 0.0 and 0.1 < hi0 < 0.2
    lo1, hi1 = wilson(20, 20)
    assert hi1 == pytest.approx(1.0) and 0.8 < lo1 < 0.9
    assert wilson(0, 0) == (0.0, 1.0)


def test_paired_diff_identical_is_exactly_zero() -> None:
    a = _vec(7, 20)
    d = paired_diff(a, a.copy())
    assert (d.points, d.lo, d.hi) == (0.0, 0.0, 0.0)


def test_paired_diff_one_sided_and_seeded() -> None:
    a, b = _vec(15, 20), _vec(5, 20)  # a right on every image b gets right, and on 10 more
    d = paired_diff(a, b, seed=3)
    assert d.points == pytest.approx(50.0)
    assert 0 < d.lo <= 50 <= d.hi <= 100
    assert paired_diff(a, b, seed=3) == d  # seeded: the same interval every time
    rev = paired_diff(b, a, seed=3)
    assert rev.points == pytest.approx(-50.0) and rev.hi < 0


def test_paired_diff_pairs_the_images() -> None:
    # same top-1 (50 %), disagreeing on every image: an unpaired view would see no difference either, but the
    # paired CI is wide (every image moves the difference by a full point of 1/n)
    a = np.array([True, False] * 10)
    d = paired_diff(a, ~a)
    assert d.points == 0.0 and d.lo < -20 and d.hi > 20


def test_paired_diff_refuses_mismatched_lengths() -> None:
    with pytest.raises(ValueError):
        paired_diff(_vec(1, 3), _vec(1, 4))


def test_simplicity_order() -> None:
    assert simplicity_order(["t3ar", "bn-adapt", "tent", "source", "t3ar"]) == ["source", "bn-adapt", "t3ar", "tent"]
    assert simplicity_order(["tent", "shot-im"]) == ["tent", "shot-im"]


def test_default_rule_is_the_one_validation_chose() -> None:
    """The product's default winner rule is what the cpu plan chose on its validation shifts (docs/benchmarks)."""
    import json
    from pathlib import Path

    report = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "adaptation-cpu.json"
    assert DEFAULT_RULE == json.loads(report.read_text())["selection"]["winner_rule"]["chosen"]


def test_paired_keeps_the_simpler_when_the_gain_is_noise() -> None:
    n = 20
    src = _vec(10, n)
    bn = src.copy()
    bn[10] = True  # one image more: +5 points, a CI that reaches 0
    acc = decide({"source": src, "bn-adapt": bn}, "paired")
    assert acc.winner == "source" and acc.score("bn-adapt").vs_source is not None
    assert acc.score("bn-adapt").vs_source.lo <= 0  # type: ignore[union-attr]
    # argmax takes the higher top-1 however small the gain
    assert decide({"source": src, "bn-adapt": bn}, "argmax").winner == "bn-adapt"


def test_paired_moves_along_the_chain() -> None:
    n = 40
    src, bn, t3 = _vec(10, n), _vec(25, n), _vec(38, n)  # nested: each right wherever the simpler one is
    acc = decide({"t3ar": t3, "bn-adapt": bn, "source": src}, "paired")
    assert [s.name for s in acc.scores] == ["source", "bn-adapt", "t3ar"]
    assert acc.winner == "t3ar"
    assert len(acc.steps) == 2 and acc.steps[0].startswith("bn-adapt - source") and "t3ar wins" in acc.steps[1]


def test_paired_compares_with_the_champion_not_the_base() -> None:
    n = 40
    src, bn = _vec(10, n), _vec(30, n)
    t3 = src.copy()
    t3[10:31] = True  # 31 right: far above source, one image above bn-adapt (noise against the champion)
    acc = decide({"source": src, "bn-adapt": bn, "t3ar": t3}, "paired")
    assert acc.winner == "bn-adapt"
    assert decide({"source": src, "bn-adapt": bn, "t3ar": t3}, "argmax").winner == "t3ar"


def test_argmax_ties_go_to_the_simpler() -> None:
    n = 10
    a = _vec(6, n)
    b = np.roll(a, 3)  # the same top-1, other images
    assert decide({"t3ar": b, "bn-adapt": a}, "argmax").winner == "bn-adapt"
    assert decide({"tent": a, "t3ar": b}, "argmax").winner == "tent"  # others: as listed
    assert decide({"t3ar": a, "source": b, "bn-adapt": a}, "argmax").winner == "source"
    acc = decide({"t3ar": a, "source": b}, "argmax")
    assert "tied with t3ar" in acc.reason


def test_paired_ties_keep_the_base() -> None:
    a = _vec(6, 10)
    acc = decide({"source": a, "bn-adapt": a.copy(), "t3ar": a.copy()}, "paired")
    assert acc.winner == "source" and "the simplest (source) kept" in acc.reason


def test_differences_against_missing_references_are_none() -> None:
    acc = decide({"tent": _vec(3, 5), "t3ar": _vec(4, 5)})
    assert all(s.vs_source is None and s.vs_bn_adapt is None for s in acc.scores)
    acc = decide({"source": _vec(3, 5), "bn-adapt": _vec(4, 5)})
    assert acc.score("source").vs_source is None and acc.score("source").vs_bn_adapt is not None
    assert acc.score("bn-adapt").vs_bn_adapt is None


def test_decide_refuses_bad_input() -> None:
    with pytest.raises(ValueError):
        decide({})
    with pytest.raises(ValueError):
        decide({"source": _vec(1, 3), "t3ar": _vec(1, 4)})
    with pytest.raises(ValueError):
        decide({"source": _vec(1, 3)}, "best")  # type: ignore[arg-type]


def test_gain_refusal() -> None:
    src, bn = _vec(5, 10), _vec(5, 10)
    acc = decide({"source": src, "bn-adapt": bn})
    msg = gain_refusal(acc)
    assert msg is not None and "no candidate beats the base model" in msg and "require_gain" in msg
    better = decide({"source": _vec(0, 30), "bn-adapt": _vec(30, 30)})
    assert better.winner == "bn-adapt" and gain_refusal(better) is None


def test_record_is_json_able() -> None:
    import json

    rec = as_record(decide({"source": _vec(2, 8), "bn-adapt": _vec(6, 8), "t3ar": _vec(7, 8)}, seed=1))
    again = json.loads(rec.model_dump_json())
    assert again["winner"] in ("source", "bn-adapt", "t3ar") and again["rule"] == DEFAULT_RULE
    assert [c["name"] for c in again["candidates"]] == ["source", "bn-adapt", "t3ar"]
    assert again["candidates"][1]["vs_source"]["points"] == pytest.approx(50.0)


def test_the_record_keeps_the_winners_paired_difference_to_the_runner_up() -> None:
    """Issue 50: "within noise" needs the winner against the best other candidate, also when neither is the base
    model nor bn-adapt (whose differences alone the record kept)."""
    rng = np.random.default_rng(3)
    correct = {"source": rng.random(60) < 0.3, "tent": rng.random(60) < 0.5, "t3ar": rng.random(60) < 0.55}
    acc = decide(correct, "argmax", seed=2)
    assert acc.runner_up is not None
    name, d = acc.runner_up
    others = sorted((s for s in acc.scores if s.name != acc.winner), key=lambda s: -s.top1)
    assert name == others[0].name and name != "source"
    assert d == paired_diff(correct[acc.winner], correct[name], seed=2)
    rec = as_record(acc)
    assert rec.runner_up is not None
    assert (rec.runner_up.name, rec.runner_up.points, rec.runner_up.lo, rec.runner_up.hi) == (
        name, round(d.points, 3), round(d.lo, 3), round(d.hi, 3))
    assert as_record(decide({"source": _vec(3, 8)})).runner_up is None  # one candidate: nobody to beat

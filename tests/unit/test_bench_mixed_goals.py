"""The mixed-pool goals (issue 52): paired differences in points over shift x seed, per fraction; the validation
choice of the labelled ranking arm; the accepted model on the labelled path; the report's verdicts."""

from __future__ import annotations

import pytest

from t3ar_bench.retrieval.mixed_goals import LABELLED, MIXED_GOALS, RANKING_ARMS, choose_labelled, mixed_goals
from t3ar_bench.retrieval.mixed_main import MIXED_ARMS
from t3ar_bench.retrieval.mixed_report import markdown, report, verdict


def _rec(label: str, shift: str, seed: int, top1: float, phase: str = "mixed", **extra: object) -> dict[str, object]:
    return {"label": label, "shift": shift, "seed": seed, "fraction": 0.1, "top1": top1, "phase": phase, **extra}


def test_every_goal_names_arms_the_cell_runs() -> None:
    arms = {label for label, *_ in MIXED_ARMS}
    named = {a for pair in MIXED_GOALS.values() for a in pair} - {LABELLED}
    assert named <= arms and set(RANKING_ARMS.values()) <= arms


def test_mixed_goals_pair_the_cells_and_leave_out_incomplete_ones() -> None:
    records = [_rec("t3ar", s, seed, 0.50 + 0.01 * seed + (0.04 if s == "a" else 0.02))
               for s in ("a", "b") for seed in (0, 1)]
    records += [_rec("t3ar-random", s, seed, 0.50 + 0.01 * seed) for s in ("a", "b") for seed in (0, 1)]
    records += [_rec("t3ar-labels", "a", 0, 0.9), _rec("t3ar-random", "a", 0, 0.0, phase="main")]
    got = mixed_goals(records, ["a", "b"], [0, 1], [0.1])
    assert set(got) == {"mixed_retrieval_vs_uniform"}  # the labelled goals lack cells
    cell = got["mixed_retrieval_vs_uniform"]["test"]["0.1"]
    assert cell["mean"] == pytest.approx(3.0) and cell["n"] == 4
    assert cell["per_shift"] == pytest.approx({"a": 4.0, "b": 2.0}) and cell["lo"] < 3.0 < cell["hi"]


def test_validation_chooses_the_ranking_arm_by_its_own_shift_only() -> None:
    records = [_rec("t3ar-labels", "val", s, 0.50) for s in (0, 1)]
    records += [_rec("t3ar-labels-class-conditional", "val", s, 0.52) for s in (0, 1)]
    records += [_rec("t3ar-labels-base-rerank", "val", s, 0.51) for s in (0, 1)]
    # an evaluation shift where another arm is far better must not sway the choice
    records += [_rec("t3ar-labels-base-rerank", "ev", s, 0.99) for s in (0, 1)]
    assert choose_labelled(records, "val") == "t3ar-labels-class-conditional"
    tie = [_rec(a, "val", 0, 0.5) for a in RANKING_ARMS.values()]
    assert choose_labelled(tie, "val") == "t3ar-labels"  # the simplest on a tie
    assert choose_labelled([], "val") == "t3ar-labels"


def _holdout(top1: float, correct: list[bool]) -> dict[str, object]:
    return {"1": {"top1": top1, "n": len(correct), "correct": correct}}


def test_the_accepted_model_is_the_holdout_winner_among_source_bn_adapt_and_the_chosen_arm() -> None:
    records = []
    for seed in (0, 1):
        # on the holdout the chosen arm wins in seed 0, bn-adapt in seed 1; their evaluation top-1 differ
        records += [_rec("source", "ev", seed, 0.30, holdout=_holdout(0.2, [True, False, False, False, False])),
                    _rec("bn-adapt", "ev", seed, 0.40,
                         holdout=_holdout(0.6 if seed else 0.4, [True, True, seed == 1, False, False])),
                    _rec("t3ar-labels-class-conditional", "ev", seed, 0.45 + 0.1 * seed,
                         holdout=_holdout(0.8 if seed == 0 else 0.2, [True, True, True, True, False] if seed == 0
                                          else [True, False, False, False, False]))]
    got = mixed_goals(records, ["ev"], [0, 1], [0.1], "t3ar-labels-class-conditional")
    acc = got["accepted_vs_bn_adapt_labelled"]["test"]["0.1"]
    assert acc["n"] == 2 and acc["mean"] == pytest.approx((5.0 + 0.0) / 2)
    hind = got["accepted_vs_hindsight_labelled"]["test"]["0.1"]  # hindsight: the chosen arm (mean 0.50)
    assert hind["mean"] == pytest.approx(((0.45 - 0.45) + (0.40 - 0.55)) * 100 / 2)


def test_verdicts_say_met_not_met_and_noise() -> None:
    assert verdict({"mean": 3.5, "lo": 0.5, "hi": 6.5}, 3.0) == "met"
    assert verdict({"mean": 3.5, "lo": -0.5, "hi": 7.5}, 3.0) == "not met (within noise of 0)"
    assert verdict({"mean": 1.0, "lo": 0.2, "hi": 1.8}, 3.0) == "not met"
    assert verdict({"mean": -0.5, "lo": -1.5, "hi": 0.5}, -1.0) == "met"  # a no-harm bar needs no CI above 0
    assert verdict({"mean": 0.3, "lo": -0.5, "hi": 1.1}, None) == "noise"


def test_the_report_reads_the_choice_and_renders() -> None:
    records = []
    for shift in ("val", "ev1", "ev2"):
        for seed in (0, 1):
            for label, top1 in (("t3ar", 0.5), ("t3ar-random", 0.48), ("t3ar-labels", 0.55),
                                ("t3ar-labels-class-conditional", 0.56 if shift == "val" else 0.50),
                                ("t3ar-random-labels", 0.50), ("bn-adapt", 0.52)):
                records.append(_rec(label, shift, seed, top1 + 0.01 * seed))
    results = {"shifts": ["val", "ev1", "ev2"], "seeds": [0, 1], "fractions": [0.1], "records": records,
               "arms": [a[0] for a in MIXED_ARMS],
               "pools": {"val": {"total": 100, "relevant": 5, "unrelated": 95, "relevant_share": 0.05}},
               "plan": {"max_steps": 40, "k": 5, "image_size": 64, "retriever": "r", "retriever_size": 96},
               "seconds": {"run_seconds_total": 1.0, "pools": 1.0, "embedded_images": 0}}
    rep = report(results, validation="val")
    assert rep["choice"]["labelled"] == "t3ar-labels-class-conditional" and rep["evaluation_shifts"] == ["ev1", "ev2"]
    g = rep["goals"]["labelled_vs_bn_adapt"]["test"]["0.1"]  # the chosen arm on the evaluation shifts: 50 - 52
    assert g["mean"] == pytest.approx(-2.0) and g["verdict"] == "not met"
    text = markdown(rep)
    assert "t3ar-labels-class-conditional" in text and "labelled_vs_bn_adapt" in text

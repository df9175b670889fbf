"""Issue 52's figures into adaptation-cpu.{json,md}: every key of the last round kept, the replaced goals moved
aside, provenance said, the markdown section replaced on a re-run."""

from __future__ import annotations

from t3ar_bench.retrieval.mixed_adopt import ISSUE_GOALS, adopt, section, with_section


def _goal(mean: float) -> dict[str, object]:
    return {"test": {"0.1": {"mean": mean, "lo": mean - 1, "hi": mean + 1, "n": 9, "per_shift": {"a": mean},
                             "verdict": "noise"}}}


def _mixed() -> dict[str, object]:
    return {"goals": {"mixed_retrieval_vs_uniform": _goal(0.5), "labelled_vs_random": _goal(0.2),
                      "whole_pool_vs_bn_adapt": _goal(4.0)},
            "validation_shift": "v", "evaluation_shifts": ["a"], "seeds": [0], "fractions": [0.1],
            "choice": {"labelled": "t3ar-labels", "ranking": "index"}, "bars": {"labelled_vs_random": 1.5}}


def _neighbours() -> dict[str, object]:
    cell = {"precision_at_5": 0.3, "pseudo_label_accuracy": 0.4, "hit_rate": 0.6}
    return {"neighbour_precision": {"index": {"0.1": {"per_shift": {"a": cell}}}}}


def test_adopt_keeps_every_key_and_moves_the_replaced_goals_aside() -> None:
    last = {"plan": {"name": "cpu"}, "records": [1, 2], "goals": {"labelled_vs_random": _goal(-0.4),
                                                                  "no_harm": _goal(0.0)}}
    out = adopt(last, _mixed(), _neighbours(), source="run X")
    assert set(last) <= set(out) and set(last["goals"]) <= set(out["goals"])
    g = out["goals"]
    assert g["labelled_vs_random"]["test"]["0.1"]["mean"] == 0.2  # the new run
    assert g["labelled_vs_random_labelled_pool"]["test"]["0.1"]["mean"] == -0.4  # the last round's, kept
    assert g["no_harm"] == last["goals"]["no_harm"] and out["records"] == [1, 2]
    assert set(ISSUE_GOALS) <= set(g) and g["accepted_vs_bn_adapt_labelled"] == {"test": {}}  # not computed: empty
    assert "mixed_whole_pool_vs_bn_adapt" in g  # the grid's other goals, prefixed
    assert g["neighbour_precision"] == {"index": {"0.1": {"per_shift": {"a": {"precision_at_5": 0.3,
                                                                               "pseudo_label_accuracy": 0.4}}}}}
    assert g["provenance"]["labelled_vs_random"] == "run X"
    assert "acceptance round" in g["provenance"]["labelled_vs_random_labelled_pool"]
    assert last["goals"]["labelled_vs_random"]["test"]["0.1"]["mean"] == -0.4  # the input is not changed
    again = adopt(out, _mixed(), None, source="run Y")  # a re-run keeps the first move, not the new values
    assert again["goals"]["labelled_vs_random_labelled_pool"]["test"]["0.1"]["mean"] == -0.4


def test_the_markdown_section_is_replaced_on_a_re_run() -> None:
    out = adopt({"goals": {}}, _mixed(), _neighbours(), source="run X")
    text = section(out)
    assert "labelled_vs_random" in text and "+0.2 [-0.8, +1.2]" in text and "index" in text
    once = with_section("# Report\n\nbody\n", text)
    twice = with_section(once, text.replace("run X", "run Y"))
    assert once.count("issue-52:start") == 1 and twice.count("issue-52:start") == 1
    assert "run Y" in twice and "run X" not in twice and twice.startswith("# Report\n\nbody\n")

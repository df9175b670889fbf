"""The registry benchmark's verdict (t3ar_bench.job.registry): rounds whose spread is wider than the goal say
"within noise", never a pass or a fail."""

from t3ar_bench.job.registry import _verdict


def _summary(*pairs: tuple[float, float]) -> dict[str, object]:
    rows = [{"off_s": off, "on_s": on} for off, on in pairs]
    pcts = sorted(100 * (on / off - 1) for off, on in pairs)
    return {"rounds": rows, "paired_overhead_pct_median": pcts[len(pcts) // 2]}


def test_a_spread_wider_than_the_goal_is_noise() -> None:
    assert _verdict(_summary((56.9, 44.5), (46.4, 47.9), (51.8, 70.5))).startswith("Within noise")


def test_tight_rounds_meet_or_miss_the_goal() -> None:
    assert _verdict(_summary((50.0, 50.5), (50.0, 50.2), (50.0, 50.4))).startswith("Goal met")
    assert _verdict(_summary((50.0, 52.0), (50.0, 52.5), (50.0, 52.2))).startswith("Goal not met")

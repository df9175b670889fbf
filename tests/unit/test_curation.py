"""Pool curation's planner (t3ar.curation): greedy, oldest first, untouchable sources stay, every removal has a
kept duplicate at or above the threshold; the IVF path finds planted duplicates like the exact one."""

from __future__ import annotations

import numpy as np
import pytest

from t3ar.curation import plan_removals


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _pool(n: int, dups: int, d: int = 32, seed: int = 0) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """n random unit vectors, then ``dups`` near-copies (cosine ~0.999) of random earlier ones."""
    rng = np.random.default_rng(seed)
    base = _unit(rng.standard_normal((n, d)))
    src = rng.choice(n, size=dups, replace=False)
    copies = _unit(base[src] + 0.01 * rng.standard_normal((dups, d)))
    return np.concatenate([base, copies]), [(int(s), n + i) for i, s in enumerate(src)]


def test_keeps_the_oldest_and_every_removal_has_a_kept_duplicate() -> None:
    vecs, pairs = _pool(200, 20)
    plan = plan_removals(vecs, np.ones(len(vecs), dtype=bool), 0.99)
    assert plan.method == "exact" and plan.scanned == len(vecs)
    removed = {r.row for r in plan.removals}
    assert removed == {copy for _, copy in pairs}  # the later copy goes, the original stays
    kept = set(range(len(vecs))) - removed
    for r in plan.removals:
        assert r.duplicate_of in kept and r.score >= 0.99
        assert float(vecs[r.row] @ vecs[r.duplicate_of]) == pytest.approx(r.score, abs=1e-5)


def test_untouchable_items_always_stay_and_are_kept_for_their_duplicates() -> None:
    vecs, pairs = _pool(100, 10, seed=1)
    removable = np.zeros(len(vecs), dtype=bool)
    removable[:100] = True  # the originals may go, the (newer) copies may not
    plan = plan_removals(vecs, removable, 0.99)
    assert {r.row for r in plan.removals} == {orig for orig, _ in pairs}
    assert {(r.row, r.duplicate_of) for r in plan.removals} == set(pairs)


def test_a_chain_removes_only_what_has_a_kept_duplicate() -> None:
    e = np.eye(3, dtype=np.float32)
    a = e[0]
    b = _unit((e[0] + 0.2 * e[1])[None])[0]  # cos(a, b) ~ 0.98
    c = _unit((e[0] + 0.4 * e[1])[None])[0]  # cos(b, c) ~ 0.98, cos(a, c) ~ 0.93
    plan = plan_removals(np.stack([a, b, c]), np.ones(3, dtype=bool), 0.97)
    assert [(r.row, r.duplicate_of) for r in plan.removals] == [(1, 0)]  # c stays: b, its duplicate, is gone


def test_nothing_removable_or_nothing_similar_removes_nothing() -> None:
    vecs, _ = _pool(50, 5)
    assert plan_removals(vecs, np.zeros(len(vecs), dtype=bool), 0.9).removals == []
    assert plan_removals(_unit(np.eye(8, dtype=np.float32)), np.ones(8, dtype=bool), 0.5).removals == []


def test_ivf_path_finds_the_planted_duplicates() -> None:
    vecs, pairs = _pool(3000, 100, d=64, seed=2)
    exact = plan_removals(vecs, np.ones(len(vecs), dtype=bool), 0.99)
    ivf = plan_removals(vecs, np.ones(len(vecs), dtype=bool), 0.99, exact_max=100, nprobe=8)
    assert ivf.method == "ivf" and ivf.nlist and ivf.nprobe == 8
    found = {r.row for r in ivf.removals}
    assert found <= {r.row for r in exact.removals}  # approximate: may miss, never invents
    assert len(found) >= 0.9 * len(pairs)


@pytest.mark.parametrize("threshold", [0.0, -0.5, 1.01])
def test_threshold_out_of_range_is_refused(threshold: float) -> None:
    with pytest.raises(ValueError, match="threshold"):
        plan_removals(np.eye(2, dtype=np.float32), np.ones(2, dtype=bool), threshold)

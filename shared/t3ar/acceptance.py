"""The acceptance check of a job with a labelled holdout: which candidate model it returns. Pure numpy (its record
is the job contract's :class:`~t3ar.clients.job_report.AcceptanceRecord`).

Each candidate (``source``: the base model as it is, ``bn-adapt``, the requested method, or a list) is scored on
the same holdout images, as a boolean vector ``correct[i]`` (its top-1 prediction of image i is the label). From
those vectors alone:

- **top-1 and its 95 % CI**: the Wilson score interval (exact formula, no randomness; sound at small n and at 0 or
  100 %, where the normal interval is not).
- **paired differences**, in points (``a - b``), with a **paired 95 % CI**: a percentile bootstrap over holdout
  images, the same resampled images for both candidates (the pairing), ``resamples`` draws from a
  ``numpy.random.default_rng(seed)``: the same vectors and seed always give the same interval.
- **the winner**, by one of :data:`RULES`:

  * ``paired``: the simpler candidate unless a paired test favours another. Candidates are taken in
    order of simplicity (:func:`simplicity_order`: ``source``, ``bn-adapt``, then the others as listed); the first
    is the champion, and each later one replaces the champion only when its paired CI against the champion lies
    above 0 (its low end > 0). A tie or a gain the holdout cannot tell from noise keeps the simpler model.
  * ``argmax`` (the default): the highest top-1; a tie goes to the simpler candidate (the same order).

``require_gain``: :func:`gain_refusal` says why a job must fail when the winner is the base model (``source``).

The winner's paired difference to the **runner-up** (the best of the others) is recorded too: when its CI includes
0 the holdout cannot tell the two apart (:func:`within_noise`), and :func:`images_to_resolve` says how many holdout
images would.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np

from t3ar.clients.job_report import AcceptanceRecord, CandidateRecord, PairedPoints, RunnerUp

Rule = Literal["paired", "argmax"]
RULES: tuple[Rule, ...] = get_args(Rule)
#: the rule a job uses when it names none: the one the method benchmark chose on its validation shifts (the cpu plan,
#: ``selection.winner_rule.chosen`` of docs/benchmarks/adaptation-cpu.json; a unit test keeps the two equal).
#: There ``argmax`` earned 19.3 % on the worse validation shift against ``paired``'s 16.2 % at one holdout image per
#: class: with so few images ``paired`` keeps the base model even where an adapted one is clearly better.
DEFAULT_RULE: Rule = "argmax"
BASE = "source"
BN_ADAPT = "bn-adapt"
Z95 = 1.959963984540054
DEFAULT_RESAMPLES = 2000
#: the difference (points) that :func:`images_to_resolve` sizes a holdout for
RESOLVE_POINTS = 3.0


@dataclass(frozen=True)
class PairedDiff:
    """``a - b`` in points (top-1 x 100), and its paired 95 % CI."""

    points: float
    lo: float
    hi: float


@dataclass(frozen=True)
class CandidateScore:
    """One candidate on the holdout: top-1 (a fraction), its Wilson 95 % CI, and its paired differences to the base
    model and to bn-adapt (None when that candidate is not among them, or for itself)."""

    name: str
    top1: float
    lo: float
    hi: float
    n: int
    vs_source: PairedDiff | None = None
    vs_bn_adapt: PairedDiff | None = None


@dataclass(frozen=True)
class Acceptance:
    """The decision: every candidate's score (in simplicity order), the rule, the winner and why."""

    scores: list[CandidateScore]
    rule: Rule
    winner: str
    reason: str
    resamples: int = DEFAULT_RESAMPLES
    seed: int = 0
    steps: list[str] = field(default_factory=list)  # the paired rule's comparisons, one line each
    runner_up: tuple[str, PairedDiff] | None = None  # the best other candidate, and winner - it (None: one candidate)

    def score(self, name: str) -> CandidateScore:
        return next(s for s in self.scores if s.name == name)


def wilson(correct: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of ``correct`` successes in ``n`` trials ((0, 1) for n = 0)."""
    if n <= 0:
        return 0.0, 1.0
    p = correct / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def _as_bool(v: Sequence[bool] | np.ndarray) -> np.ndarray:
    a = np.asarray(v)
    if a.ndim != 1:
        raise ValueError("a candidate's correctness must be a 1-d vector over the holdout images")
    return a.astype(bool)


def paired_diff(a: Sequence[bool] | np.ndarray, b: Sequence[bool] | np.ndarray, *, resamples: int = DEFAULT_RESAMPLES,
                seed: int = 0) -> PairedDiff:
    """``top1(a) - top1(b)`` in points with a paired percentile-bootstrap 95 % CI over the holdout images."""
    x, y = _as_bool(a), _as_bool(b)
    if len(x) != len(y) or len(x) == 0:
        raise ValueError("paired vectors must be the same, non-zero length (the same holdout images)")
    d = x.astype(np.int8) - y.astype(np.int8)
    mean = 100.0 * float(d.mean())
    if not d.any():  # identical on every image: every resample gives 0
        return PairedDiff(0.0, 0.0, 0.0)
    rng = np.random.default_rng(seed)
    n, total = len(d), np.empty(resamples)
    for start in range(0, resamples, 256):  # bounded memory: 256 resamples of n indices at a time
        m = min(256, resamples - start)
        total[start:start + m] = d[rng.integers(0, n, size=(m, n))].mean(axis=1)
    lo, hi = np.percentile(100.0 * total, [2.5, 97.5])
    return PairedDiff(mean, float(lo), float(hi))


def simplicity_order(names: Sequence[str]) -> list[str]:
    """``source`` first, ``bn-adapt`` second (when present), then the others in the order given; duplicates
    dropped."""
    uniq = list(dict.fromkeys(names))
    head = [n for n in (BASE, BN_ADAPT) if n in uniq]
    return head + [n for n in uniq if n not in head]


def decide(correct: Mapping[str, Sequence[bool] | np.ndarray], rule: Rule = DEFAULT_RULE, *,
           resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> Acceptance:
    """Score every candidate and pick the winner by ``rule`` (see the module docstring). ``correct`` maps a
    candidate's name to its correctness on the holdout (all the same length); its order is the order of the
    candidates after ``source`` and ``bn-adapt``."""
    if rule not in RULES:
        raise ValueError(f"unknown winner rule {rule!r}; one of {', '.join(RULES)}")
    if not correct:
        raise ValueError("no candidates")
    order = simplicity_order(list(correct))
    vec = {name: _as_bool(correct[name]) for name in order}
    n = len(vec[order[0]])
    if n == 0 or any(len(v) != n for v in vec.values()):
        raise ValueError("every candidate must be scored on the same, non-empty holdout")
    cache: dict[tuple[str, str], PairedDiff] = {}

    def diff(a: str, b: str) -> PairedDiff:
        if (a, b) not in cache:
            cache[(a, b)] = paired_diff(vec[a], vec[b], resamples=resamples, seed=seed)
        return cache[(a, b)]

    scores = []
    for name in order:
        k = int(vec[name].sum())
        lo, hi = wilson(k, n)
        scores.append(CandidateScore(
            name, k / n, lo, hi, n,
            vs_source=diff(name, BASE) if BASE in vec and name != BASE else None,
            vs_bn_adapt=diff(name, BN_ADAPT) if BN_ADAPT in vec and name != BN_ADAPT else None))
    steps: list[str] = []
    if rule == "argmax":
        best = max(s.top1 for s in scores)
        winner = next(s.name for s in scores if s.top1 == best)  # the simplest of the best
        tied = [s.name for s in scores if s.top1 == best]
        reason = (f"highest top-1 on the holdout ({100 * best:.1f} %)"
                  + (f"; tied with {', '.join(t for t in tied if t != winner)}: the simpler kept" if len(tied) > 1
                     else ""))
    else:
        winner = order[0]
        for name in order[1:]:
            d = diff(name, winner)
            won = d.lo > 0
            steps.append(f"{name} - {winner}: {d.points:+.1f} points [{d.lo:+.1f}, {d.hi:+.1f}]: "
                         + (f"{name} wins" if won else f"{winner} kept"))
            if won:
                winner = name
        won_steps = [s for s in steps if s.endswith(f"{winner} wins")]
        reason = (f"a paired CI above 0: {won_steps[-1]}" if won_steps else
                  f"no candidate's paired CI against a simpler one lies above 0: the simplest ({winner}) kept")
    others = [s for s in scores if s.name != winner]
    runner = max(others, key=lambda s: s.top1).name if others else None  # a tie: the simpler (max keeps the first)
    return Acceptance(scores, rule, winner, reason, resamples, seed, steps,
                      (runner, diff(winner, runner)) if runner is not None else None)


def within_noise(d: PairedDiff) -> bool:
    """Whether a paired difference's 95 % CI includes 0: the holdout cannot tell the two candidates apart."""
    return d.lo <= 0.0 <= d.hi


def images_to_resolve(n: int, lo: float, hi: float, points: float = RESOLVE_POINTS) -> int | None:
    """Holdout images that would resolve a difference of ``points`` between two candidates (its paired 95 % CI
    clear of 0), from their paired CI ``[lo, hi]`` (points) on ``n`` images.

    The paired standard error of a top-1 difference on n images is ``SE_n = s / sqrt(n)``, with ``s`` the standard
    deviation of the per-image difference ``d_i = correct_a[i] - correct_b[i]``; the CI's half-width ``h = (hi -
    lo) / 2`` is about ``1.96 SE_n``. On N images the half-width is ``h sqrt(n / N)``, and it is at most
    ``points`` when ``N = n (h / points)^2`` (rounded up). None when ``h`` is 0: the two agree on every image, so
    this holdout says nothing about how they spread."""
    half = (hi - lo) / 2.0
    if n <= 0 or half <= 0.0:
        return None
    return math.ceil(n * (half / points) ** 2)


def gain_refusal(acc: Acceptance) -> str | None:
    """Why a job that requires a gain fails (the winner is the base model), or None when the winner beats it."""
    if acc.winner != BASE:
        return None
    best = max((s for s in acc.scores if s.name != BASE), key=lambda s: s.top1, default=None)
    base = acc.score(BASE)
    detail = ""
    if best is not None and best.vs_source is not None:
        d = best.vs_source
        detail = (f"; the best other, {best.name}, scored {100 * best.top1:.1f} % ({d.points:+.1f} points "
                  f"[{d.lo:+.1f}, {d.hi:+.1f}])")
    return (f"no candidate beats the base model on the holdout (rule {acc.rule}: source {100 * base.top1:.1f} % of "
            f"{base.n} images{detail}); require_gain is set, so no checkpoint is returned: add holdout images, "
            "try other candidates, or keep the base model")


def as_record(acc: Acceptance, *, require_gain: bool = False, seconds: Mapping[str, float] | None = None,
              methods: Mapping[str, str] | None = None, classes: int | None = None,
              pool_use: Mapping[str, Mapping[str, Any]] | None = None) -> AcceptanceRecord:
    """The decision as the job contract's record (what a job report, ``GET /jobs/{id}`` and a checkpoint's metadata
    carry), with each candidate's wall ``seconds`` and ``methods`` (by candidate name), the holdout's ``classes``
    and what each candidate drew from the pool (``pool_use``: name -> the :class:`~t3ar.clients.job_report.
    CandidateRecord` fields ``pool_ids_used``, ``labelled_neighbours_total``, ``neighbour_quality``) when given."""
    def points(d: PairedDiff | None) -> PairedPoints | None:
        return None if d is None else PairedPoints(points=round(d.points, 3), lo=round(d.lo, 3), hi=round(d.hi, 3))

    return AcceptanceRecord(
        rule=acc.rule, winner=acc.winner, reason=acc.reason, n=acc.scores[0].n, ci="wilson 95 %",
        paired_ci=f"paired bootstrap 95 % ({acc.resamples} resamples, seed {acc.seed})", steps=list(acc.steps),
        require_gain=require_gain, classes=classes,
        runner_up=None if acc.runner_up is None else RunnerUp(
            name=acc.runner_up[0], points=round(acc.runner_up[1].points, 3), lo=round(acc.runner_up[1].lo, 3),
            hi=round(acc.runner_up[1].hi, 3)),
        candidates=[CandidateRecord(name=s.name, method=(methods or {}).get(s.name), top1=round(s.top1, 6),
                                    ci=[round(s.lo, 6), round(s.hi, 6)], n=s.n, vs_source=points(s.vs_source),
                                    vs_bn_adapt=points(s.vs_bn_adapt),
                                    seconds=round(seconds[s.name], 3) if seconds and s.name in seconds else None,
                                    **(pool_use or {}).get(s.name, {}))
                    for s in acc.scores])

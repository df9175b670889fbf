"""What a job did, in the words the console's pages and ``t3ar jobs show`` share (issue 50: the pages say what
happened): the model a job returned (with a holdout the winner may be the base model itself, and then the job
must not read as an adapted one), whether its win is within noise, and what its progress is at.

Pure functions of the API's typed answers (:mod:`t3ar.clients.api_models`); no I/O.
"""

from __future__ import annotations

import math

from t3ar.acceptance import BASE, BN_ADAPT, RESOLVE_POINTS, images_to_resolve
from t3ar.clients.api_models import JobConfig, JobOut, Progress
from t3ar.clients.job_report import AcceptanceRecord, RunnerUp

#: a winner that did not adapt: the headline names what the checkpoint is
UNADAPTED = {BASE: "the base model, unchanged (source won on the holdout): the checkpoint is the uploaded model",
             BN_ADAPT: "the base model with its BatchNorm statistics re-estimated on the target (bn-adapt won on "
                       "the holdout): no weight was trained"}


def method_name(config: JobConfig) -> str:
    """The method as a list shows it: with its preset (``t3ar · validated``), which tells apart jobs of one method
    that ran different configurations."""
    method, preset = config.method, getattr(config, "preset", None)
    return f"{method} · {preset}" if preset else method


def winner_of(job: JobOut) -> str | None:
    """The candidate a job with a holdout returned (its acceptance record, else its result), or None."""
    if job.acceptance is not None:
        return job.acceptance.winner
    return job.result.winner if job.result is not None and job.result.winner else None


def unadapted(job: JobOut) -> bool:
    """Whether the job returned the base model (``source``) or bn-adapt: its checkpoint carries no training."""
    return winner_of(job) in UNADAPTED


def returned_model(job: JobOut) -> str:
    """The headline: what the job's checkpoint is. Without a holdout, the method that ran (with its preset); with
    one, the winner: the base model or bn-adapt said as such, else the method and that it won."""
    label = method_name(job.config)
    won = winner_of(job)
    if won is None:
        return label
    if won in UNADAPTED:
        return UNADAPTED[won]
    if won == job.config.method:
        return f"{label} (won on the holdout)"
    return f"{won} (a candidate of this {label} job; won on the holdout)"


def runner_up(acc: AcceptanceRecord) -> RunnerUp | None:
    """The best candidate after the winner with the winner's paired difference to it: the record's, or (a record
    from before it was kept) rebuilt when one of the two is the base model or bn-adapt; None when unknown."""
    if acc.runner_up is not None:
        return acc.runner_up
    others = [c for c in acc.candidates if c.name != acc.winner]
    win = next((c for c in acc.candidates if c.name == acc.winner), None)
    if not others or win is None:
        return None
    best = max(others, key=lambda c: c.top1)
    own = {BASE: win.vs_source, BN_ADAPT: win.vs_bn_adapt}.get(best.name)
    if own is not None:
        return RunnerUp(name=best.name, points=own.points, lo=own.lo, hi=own.hi)
    theirs = {BASE: best.vs_source, BN_ADAPT: best.vs_bn_adapt}.get(acc.winner)
    if theirs is not None:
        return RunnerUp(name=best.name, points=-theirs.points, lo=-theirs.hi, hi=-theirs.lo)
    return None


def noise_words(acc: AcceptanceRecord) -> str | None:
    """A sentence when the winner's paired 95 % CI against the runner-up includes 0 (the holdout cannot tell them
    apart), with how many holdout images per class would resolve a difference of
    :data:`~t3ar.acceptance.RESOLVE_POINTS` (:func:`~t3ar.acceptance.images_to_resolve`: from the paired standard
    error); None when the win is clear of noise or cannot be judged."""
    r = runner_up(acc)
    if r is None or not r.lo <= 0.0 <= r.hi:
        return None
    words = (f"Within noise: {acc.winner} - {r.name} = {r.points:+.1f} points [{r.lo:+.1f}, {r.hi:+.1f}] on "
             f"{acc.n} holdout images, a paired 95 % CI that includes 0")
    need = images_to_resolve(acc.n, r.lo, r.hi)
    if need is None:
        return words + "; the two agree on every holdout image, so this holdout cannot size a larger one"
    classes = acc.classes or 0
    per = f"about {math.ceil(need / classes)} holdout images per class ({need} in all)" if classes else \
        f"about {need} holdout images"
    return words + f"; {per} would resolve a {RESOLVE_POINTS:.0f}-point difference"


def progress_words(job: JobOut, workers: int | None = None) -> str:
    """Where a job is: a queued one, what it waits for (its place in the queue; no worker listening when
    ``workers`` is 0); a running one, the candidate running (a job with a holdout), the phase, and the epoch and
    step of a training phase. Empty for a job that ended."""
    if job.status == "queued":
        ahead = job.queue_position
        words = ("waiting for a worker" if not ahead else
                 f"waiting for a worker: {ahead} job{'s' if ahead != 1 else ''} ahead in the queue")
        if workers == 0:
            words += "; no worker is listening on the queue (start one: t3ar worker)"
        return words
    if job.status != "started":
        return ""
    p = job.progress or Progress()
    parts = [f"candidate {p.candidate}"] if p.candidate else []
    parts.append(p.phase or "starting")
    if p.epochs and p.epoch is not None:
        parts.append(f"epoch {p.epoch} of {p.epochs}")  # the loop counts epochs from 1
    if p.total_steps and p.step is not None:
        parts.append(f"step {p.step} of {p.total_steps}")
    return ", ".join(parts)

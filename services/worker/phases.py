"""Where a job's time goes: the phase table of a job's report (``report["phases"]``), built in one place.

A job's worker total runs from the moment the worker parent forks the work horse to the moment the result is
uploaded; its phases (:data:`WORKER_PHASES`, in seconds) add up to that total exactly, the remainder being
``other`` (what no phase names: bookkeeping between phases). ``queue_wait`` (enqueued -> forked) comes before
the total and is not part of it. No torch here: the worker parent imports this module.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime

#: the phases inside the worker total, in the order they happen (``other`` last)
WORKER_PHASES = (
    "horse_start_imports",  # fork -> the job function has torch and the core imported
    "inputs_fetched",  # base model (or its cache) and target tar downloaded, checked, extracted
    "model_loaded",  # the checkpoint read into a model, the target read
    "target_decoded",  # target images decoded into tensors
    "target_embedded",  # the retriever embedded the target
    "pool_searched",  # nearest-neighbour search
    "neighbours_fetched",  # neighbour images fetched (or taken from the image cache) and decoded
    "bank_initialised",  # the method's set-up before its first step (memory bank, optimiser)
    "steps",  # the adaptation steps
    "evaluation",  # before and after
    "lineage",  # the target's content hash for the lineage
    "checkpoint_written",
    "checkpoint_uploaded",  # the checkpoint, then the report and lineage (which finishes the job)
    "other",
)
PHASES = ("queue_wait", *WORKER_PHASES)

#: set in the worker parent just before it forks a work horse (the horse inherits it); None outside a worker
forked_at: float | None = None


def mark_fork() -> None:
    """Record the fork time (wall clock); called by the worker parent right before it forks."""
    global forked_at
    forked_at = time.time()


def build_phases(measured: Mapping[str, float], total: float, *, queue_wait: float | None = None,
                 digits: int = 3) -> dict[str, float]:
    """The phase table: every :data:`WORKER_PHASES` key (0.0 when not measured), ``other`` = ``total`` minus
    the measured ones (never below 0: measured phases never overlap, so a negative remainder is rounding), and
    ``queue_wait`` first when known. Unknown keys in ``measured`` are an error (a phase nobody would show)."""
    unknown = set(measured) - set(WORKER_PHASES[:-1])
    if unknown:
        raise ValueError(f"unknown phase(s): {sorted(unknown)}")
    out: dict[str, float] = {}
    if queue_wait is not None:
        out["queue_wait"] = round(max(0.0, queue_wait), digits)
    for name in WORKER_PHASES[:-1]:
        out[name] = round(max(0.0, float(measured.get(name, 0.0))), digits)
    out["other"] = round(max(0.0, total - sum(max(0.0, float(measured.get(n, 0.0))) for n in WORKER_PHASES[:-1])),
                         digits)
    return out


def queue_seconds(enqueued_at: datetime | None, started: float | None) -> float | None:
    """Seconds from rq's ``enqueued_at`` (UTC) to ``started`` (a wall-clock time), None when either is unknown."""
    if enqueued_at is None or started is None:
        return None
    if enqueued_at.tzinfo is None:  # rq stores UTC
        enqueued_at = enqueued_at.replace(tzinfo=UTC)
    return started - enqueued_at.timestamp()

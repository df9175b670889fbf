"""How many batches an epoch of a job has: the schedule's count, without torch (job sizing reads it)."""

from __future__ import annotations


def steps_per_epoch(n: int, batch_size: int) -> int:
    """How many batches :func:`t3ar.method.schedule.epoch_batches` makes of ``n`` images (a last batch under half
    a batch is folded into the one before it); the one definition, torch-free because the API sizes jobs with it
    (:mod:`t3ar.jobsize`); ``tests/unit/test_bank_losses.py`` holds it to the batches."""
    full, rest = divmod(n, batch_size)
    if full == 0:
        return 1
    return full + (1 if 2 * rest >= batch_size and rest >= 2 else 0)

"""Preloading: the worker parent imports what a job imports (torch and the core) once, before it forks any
work horse, so each horse inherits the modules instead of spending seconds importing them (the job-overhead
benchmark measured 6 s of a 80 s job there, ``horse_start_imports``).

Why this is fork-safe: importing torch runs no torch op. What makes forking after torch unsafe is a thread pool
that exists at the fork (OpenMP's, torch's intra-op pool, a CUDA context): those are created by the first op
that uses them, never by an import (the one thread an import starts is numpy's OpenBLAS pool, which
re-creates itself in a forked child). So the parent imports and nothing more, and :func:`check_untouched`
refuses a CUDA context after the import. The horse sets its own thread count (``T3AR_WORKER_TORCH_THREADS``)
and device as before. This is the pattern of torch's own ``DataLoader`` workers, which are forked from a parent that has
imported torch. ``T3AR_WORKER_PRELOAD=false`` turns it off (each horse imports for itself, as before).
"""

from __future__ import annotations

import importlib
import logging
import sys
import time

log = logging.getLogger(__name__)

#: what a job imports (services/worker/jobs.py), in import order; t3ar.pipeline brings torch, torchvision, timm
MODULES = (
    "torch",
    "t3ar.pipeline",
    "t3ar.device",
    "t3ar.models.checkpoint",
    "t3ar.data.target",
    "t3ar.data.archive",
    "t3ar.data.datasets",
    "t3ar.clients.retriever",
    "t3ar_services.worker.cache",
    "t3ar_services.worker.memory",
    "t3ar_services.worker.progress",
    "t3ar_services.worker.transfer",
)


class PreloadError(RuntimeError):
    """Preloading would leave the parent in a state that is not safe to fork from."""


def check_untouched() -> None:
    """Raise :class:`PreloadError` when torch in this process holds a CUDA context (a forked job could not use
    it). Only reads state: ``torch.cuda.is_initialized`` starts nothing."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise PreloadError("CUDA is initialised in the worker parent; a forked job could not use it")


def preload(modules: tuple[str, ...] = MODULES) -> float:
    """Import ``modules`` (no torch op runs), check the process is still safe to fork from; seconds taken."""
    t = time.perf_counter()
    for name in modules:
        importlib.import_module(name)
    check_untouched()
    seconds = time.perf_counter() - t
    log.info("preloaded torch and the core in %.1fs (imports only, no torch op: forked jobs inherit them; "
             "T3AR_WORKER_PRELOAD=false turns this off)", seconds)
    return seconds

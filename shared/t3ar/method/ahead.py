"""One step ahead: the next batch's views made on a background thread while the current batch's step runs.

A step first makes its views (crop, colour, RandAugment: a few hundred small kernels, no model) and then runs
the model on them. :class:`Ahead` runs ``prepare`` (the view part) for batch t + 1 on one background thread as
soon as batch t's views are handed out, so on a CPU the rendering fills the gaps the model's forward and
backward leave on the cores (the interpreter's work between kernels, single-threaded stretches) instead of
adding to the step. That thread runs at the lowest priority (:data:`NICE`): it takes only idle cycles and never
slows the step's own parallel kernels; whatever it has not finished when the step ends it finishes then, alone.

The results are the same as without it: ``prepare`` calls are made one at a time and in batch order, so every
random stream is drawn in the same sequence (a test checks a whole run is identical both ways). The loop calls
:meth:`Ahead.settle` at the end of each step, before it reports the step: the rendering ahead overlaps only the
step that started it, never the caller's progress callback (nor, in ``t3ar bench speed``, another method's step).

Where it pays: the CPU, and CUDA (``auto`` on both). On CUDA a step at our sizes waits on the interpreter
launching kernels, not on the device; the views' launches on a second thread overlap the step's where it does
not hold the interpreter lock (the backward, kernel calls that release it). Measured on an H100
(``t3ar bench speed --variant views_inline``, two runs of 8 rounds side by side): with views inline the steps
took 1.25x / 1.18x (T3AR), 1.12x / 1.17x (no retrieval) and 1.09x / 1.02x (supervised) the time.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from types import TracebackType
from typing import Generic, TypeVar

import torch

log = logging.getLogger(__name__)

#: niceness of the thread making views ahead: the lowest priority, so that it takes only the cycles the step
#: leaves idle (measured on 2 cores: at the normal priority the two compete and a step gains nothing)
NICE = 19

T = TypeVar("T")
P = TypeVar("P")


def enabled(setting: bool | None, device: torch.device) -> bool:
    """``True``/``False`` as given; ``None`` (auto): on for the CPU and CUDA (other devices: not measured)."""
    return device.type in ("cpu", "cuda") if setting is None else setting


def _lowest_priority() -> None:
    """Run the calling thread (and the OpenMP workers it starts: they inherit it) at the lowest priority, where
    the OS allows per-thread niceness (Linux); elsewhere at the normal one."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
    except (AttributeError, OSError):
        log.debug("views ahead: could not lower the thread's priority; it runs at the normal one")


class Ahead(Generic[T, P]):
    """Iterate ``(item, prepare(item), seconds)`` over ``items``, preparing the next item on a background thread
    while the caller works on the current one (inline, in the caller's thread, when ``on`` is False).

    ``seconds``: wall time ``prepare`` took for that item, wherever it ran. :attr:`waited` is the wall time the
    caller spent on the last item handed out (waiting for it, or preparing it inline). Use as a context manager:
    leaving it stops the thread (cancelling a preparation not started; one running finishes first).
    """

    def __init__(self, items: Iterable[T], prepare: Callable[[T], P], *, on: bool) -> None:
        self._items = iter(items)
        self._prepare = prepare
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="t3ar-views",
                                        initializer=_lowest_priority) if on else None
        self._next: Future[tuple[P, float]] | None = None
        self.waited = 0.0

    def _timed(self, item: T) -> tuple[P, float]:
        t0 = time.perf_counter()
        out = self._prepare(item)
        return out, time.perf_counter() - t0

    def _submit(self) -> tuple[T, Future[tuple[P, float]]] | None:
        for item in self._items:  # at most one: the next item, if there is one
            assert self._pool is not None
            self._next = self._pool.submit(self._timed, item)
            return item, self._next
        self._next = None
        return None

    def __iter__(self) -> Iterator[tuple[T, P, float]]:
        if self._pool is None:
            for item in self._items:
                t0 = time.perf_counter()
                prepared, seconds = self._timed(item)
                self.waited = time.perf_counter() - t0
                yield item, prepared, seconds
            return
        pending = self._submit()
        while pending is not None:
            item, future = pending
            t0 = time.perf_counter()
            prepared, seconds = future.result()
            self.waited = time.perf_counter() - t0
            pending = self._submit()  # the next batch's views, made while the caller runs this one's step
            yield item, prepared, seconds

    def settle(self) -> None:
        """Wait until the preparation running ahead (if any) is done; its errors surface when its item is
        handed out."""
        if self._next is not None:
            wait([self._next])

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Ahead[T, P]:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

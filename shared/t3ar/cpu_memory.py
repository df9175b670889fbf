"""Keep freed CPU memory in the process, so large activations are not page-faulted in anew at every step.

glibc's malloc serves every request above its mmap threshold (128 KiB, rising to at most 32 MiB) with a fresh
``mmap`` and returns it with ``munmap`` on free. A no-gradient pass over 170 images at 64 px allocates
activations of up to 58 MB per layer, so at every step the kernel maps and zero-fills those pages again
(about 60,000 page faults per T3AR step on the speed benchmark's data; measured on 2 cores, the pool pass
alone took 0.33 s with them and 0.21 s without). :func:`retain_freed_memory` turns that off for the process:
one malloc arena for all threads (``M_ARENA_MAX = 1``: threads' own arenas live in mmapped heaps that are
unmapped again), no ``mmap`` for allocations (``M_MMAP_MAX = 0``) and 1 GiB of free heap top kept
(``M_TRIM_THRESHOLD``), so freed blocks are reused. The cost: the process keeps its peak heap until it exits
(a job's peak; the rq work horse that runs a job exits after it), and threads share one arena (call it
before starting threads that allocate: threads that already have an arena keep it).

The adaptation and fine-tuning loops call it on the CPU (once per process; a no-op on non-glibc systems and
with ``T3AR_CPU_RETAIN_MEMORY=false``). It changes no number, only where memory comes from.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading

log = logging.getLogger(__name__)

ENV = "T3AR_CPU_RETAIN_MEMORY"
_M_TRIM_THRESHOLD = -1  # glibc malloc.h
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
TRIM_THRESHOLD = 1 << 30  # a C int: 1 GiB of free heap top is kept

_lock = threading.Lock()
_state: dict[str, bool] = {}


def _enabled() -> bool:
    value = os.environ.get(ENV, "true").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    log.warning("%s=%r is not true or false: using true", ENV, value)
    return True


def _libc() -> ctypes.CDLL | None:
    try:
        os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):
        return None  # not glibc (musl, macOS, Windows): nothing to tune this way
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") else None


def retain_freed_memory() -> bool:
    """Tune glibc's malloc for this process as described above (idempotent). True when it is in effect."""
    with _lock:
        if "on" in _state:
            return _state["on"]
        on = False
        if _enabled():
            libc = _libc()
            if libc is not None:
                on = all(libc.mallopt(opt, value) for opt, value in ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0),
                                                                     (_M_TRIM_THRESHOLD, TRIM_THRESHOLD)))
                log.info("CPU memory: freed blocks kept for reuse (glibc mallopt)" if on
                         else "CPU memory: glibc mallopt refused; large allocations stay page-faulted per step")
        _state["on"] = on
        return on

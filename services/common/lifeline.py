"""Children that die with their parent (Linux ``prctl(PR_SET_PDEATHSIG)``, through ctypes).

A child started by `t3ar up`, or an rq work horse forked by its worker, must not outlive the process that
supervises it: an orphan keeps serving a data directory (two writers on one pool) or keeps
running a job that was already failed (F6). The kernel sends ``sig`` to the child when the thread that created
it ends (a supervisor's main thread, here). A parent that died before the call is caught by comparing the
parent pid afterwards. Elsewhere than Linux this is a no-op (the supervisors' own clean-up still runs).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies; if the parent (``parent``, the pid
    expected) is already gone, exit at once. False where it is not supported."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if parent is not None and os.getppid() != parent:  # the parent died before the call: no signal will come
        os._exit(1)
    return True


def child_preexec(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess.Popen`` making the child die (``sig``) with the process calling this."""
    parent = os.getpid()

    def preexec() -> None:
        die_with_parent(sig, parent)

    return preexec

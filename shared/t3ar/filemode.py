"""The mode a file written through a temp file gets: what ``open()`` would give a new file under the process's
umask (``tempfile.mkstemp`` makes 0600 whatever the umask, so an atomic write sets the mode itself). Under the
common umask 022 that is 0644; the services run under 077 (:mod:`t3ar_services.common.private`), so their files
are 0600."""

from __future__ import annotations

import os
import threading

__all__ = ["current_umask", "new_file_mode"]

_lock = threading.Lock()


def current_umask() -> int:
    """The process's umask (read from ``/proc/self/status`` where it says, else set and restored at once)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    with _lock:
        old = os.umask(0o077)
        os.umask(old)
    return old


def new_file_mode() -> int:
    """0o666 less the process's umask."""
    return 0o666 & ~current_umask()

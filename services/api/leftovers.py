"""What a crash of the API left in ``jobs/``: a submission cut between its first byte on disk and its record (the
uploaded archive ``jobs/<id>/upload``, a partial extraction) is never anyone's, and nothing else removes it.

:func:`sweep_leftovers` (the API's sweep, at start-up and every ``sweep_interval``) removes a job folder only when
all of these hold: no submission of this process is writing it (:class:`Submissions`), no job record names it
(its own job's, or a re-adaptation's ``target_dir``), and it has not changed for :data:`MIN_AGE` seconds. The
data directory's lock keeps every other API process off the folder, so what this process is not writing and no
record names is a leftover.

Order matters: the folders are listed first, then the in-flight set is read, then the records. A submission
registers before its folder exists and leaves the in-flight set only after its record is written (or its
folder removed), so a listed folder is either still in flight, or named by a record read afterwards, or a
leftover.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from pathlib import Path

from t3ar_services.api.store import Store

log = logging.getLogger(__name__)

#: seconds a record-less job folder must have been left unchanged before it is removed (a margin on top of the
#: in-flight set)
MIN_AGE = 600.0


class Submissions:
    """The job ids whose folders submissions of this process are writing now."""

    def __init__(self) -> None:
        self._ids: set[str] = set()
        self._lock = threading.Lock()

    def add(self, job_id: str) -> None:
        with self._lock:
            self._ids.add(job_id)

    def discard(self, job_id: str) -> None:
        with self._lock:
            self._ids.discard(job_id)

    def snapshot(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._ids)

    def __contains__(self, job_id: object) -> bool:
        with self._lock:
            return job_id in self._ids


def sweep_leftovers(data_dir: Path, store: Store, submissions: Submissions, *, min_age: float = MIN_AGE,
                    now: float | None = None) -> list[str]:
    """Remove the leftover job folders (see the module); the names removed."""
    root = data_dir / "jobs"
    if not root.is_dir():
        return []
    folders = [d for d in root.iterdir() if d.is_dir() and not d.is_symlink()]
    if not folders:
        return []
    writing = submissions.snapshot()
    named = store.job_folders()
    clock = time.time() if now is None else now
    removed = []
    for d in folders:
        if d.name in writing or d.name in named:
            continue
        try:
            if clock - d.stat().st_mtime < min_age:
                continue
        except FileNotFoundError:
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d.name)
        log.info("removed jobs/%s: a submission left it without a job record (the API stopped during it)", d.name)
    return removed

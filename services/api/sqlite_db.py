"""The API's SQLite file as each of its stores opens it: one connection shared by threads (each store guards it
with its own lock), autocommit (transactions are explicit), write-ahead log, every commit fsynced; and the part
every store shares (:class:`SqliteStore`)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import ClassVar


def open_db(path: Path) -> sqlite3.Connection:
    """A connection to ``path`` (its folder made if missing), set up as the module says; waits up to 30 s for
    another connection's write lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    return db


class SqliteStore:
    """A store of the API's SQLite file: its own connection (``_db``, opened by :func:`open_db`, the store's
    ``schema`` applied) and the lock that guards it (``_lock``)."""

    schema: ClassVar[str]

    def __init__(self, path: Path) -> None:
        self._db = open_db(path)
        self._db.executescript(self.schema)
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

"""The API's SQLite file as each of its stores opens it: one connection shared by threads (each store guards it
with its own lock), autocommit (transactions are explicit), write-ahead log, every commit fsynced; and the part
every store shares (:class:`SqliteStore`)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar


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

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction under the lock (``BEGIN IMMEDIATE``; rolled back when the block raises)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _all(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Every row ``sql`` selects, under the lock."""
        with self._lock:
            return list(self._db.execute(sql, args).fetchall())

    def close(self) -> None:
        with self._lock:
            self._db.close()

"""The API's SQLite file as each of its stores opens it: one connection shared by threads (each store guards it
with its own lock), autocommit (transactions are explicit), write-ahead log, every commit fsynced."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def open_db(path: Path) -> sqlite3.Connection:
    """A connection to ``path`` (its folder made if missing), set up as the module says; waits up to 30 s for
    another connection's write lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    return db

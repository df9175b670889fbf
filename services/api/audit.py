"""The audit log: who (key id and team) did what (an action), to what (a job, model, pool item or key id), when, and
from where (the client address as the API sees it), in an append-only table of the API's SQLite file
(``audit`` in ``api.sqlite3``: a trigger refuses every UPDATE; rows leave only by pruning).

Bounded: after each entry the oldest rows past ``max_rows`` go, and rows older than ``max_age_days``
(``T3AR_API_AUDIT_MAX_ROWS``, ``T3AR_API_AUDIT_MAX_AGE_DAYS``). Read newest first, a page at a time (``before``: the
previous page's last ``seq``), filtered by team, action or key.
"""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path
from typing import Any

from t3ar.clients.api_models import AuditOut
from t3ar_services.api.sqlite_db import SqliteStore

log = logging.getLogger(__name__)

#: the actions recorded (``outcome`` is ``ok`` or ``refused``)
ACTIONS = ("job.submit", "job.readapt", "job.cancel", "job.download", "model.upload", "pool.withdraw",
           "pool.readmit", "contribution.withdraw", "pool.compact", "key.create", "key.revoke", "sign_in", "sign_out")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS audit (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, at TEXT NOT NULL, key_id TEXT NOT NULL, team TEXT NOT NULL,
    action TEXT NOT NULL, target TEXT NOT NULL, client TEXT NOT NULL, outcome TEXT NOT NULL, detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_at ON audit (at);
CREATE INDEX IF NOT EXISTS audit_team ON audit (team, seq);
CREATE TRIGGER IF NOT EXISTS audit_append_only BEFORE UPDATE ON audit
BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
"""


_COLUMNS = tuple(AuditOut.model_fields)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class AuditLog(SqliteStore):
    schema = _SCHEMA

    def __init__(self, path: Path, *, max_rows: int, max_age_days: float) -> None:
        super().__init__(path)
        self.max_rows = max_rows
        self.max_age = dt.timedelta(days=max_age_days)

    def record(self, *, key_id: str, team: str, action: str, target: str = "", client: str = "",
               outcome: str = "ok", detail: str = "") -> None:
        """Append one entry and prune past the bounds. Never raises: a failure is logged (the action it records
        already happened)."""
        now = _now()
        try:
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    cur = self._db.execute(
                        "INSERT INTO audit (at, key_id, team, action, target, client, outcome, detail) "
                        "VALUES (?,?,?,?,?,?,?,?)", (now.isoformat(timespec="milliseconds"), key_id, team, action,
                                                     target[:300], client[:100], outcome, detail[:500]))
                    last = int(cur.lastrowid or 0)
                    self._db.execute("DELETE FROM audit WHERE seq <= ?", (last - self.max_rows,))
                    self._db.execute("DELETE FROM audit WHERE at < ?",
                                     ((now - self.max_age).isoformat(timespec="milliseconds"),))
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
        except Exception:
            log.exception("audit: could not record %s %s by %s (%s)", action, target, key_id, team)

    def page(self, *, limit: int = 100, before: int | None = None, team: str | None = None,
             action: str | None = None, key_id: str | None = None) -> list[AuditOut]:
        """Newest first; ``before``: only entries with a smaller ``seq`` (the previous page's last). A row is an
        entry as the API answers it (its columns are the answer's fields)."""
        sql, args = f"SELECT {', '.join(_COLUMNS)} FROM audit WHERE 1=1", list[Any]()
        for column, value in (("team", team), ("action", action), ("key_id", key_id)):
            if value is not None:
                sql += f" AND {column} = ?"
                args.append(value)
        if before is not None:
            sql += " AND seq < ?"
            args.append(before)
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY seq DESC LIMIT ?", (*args, limit)).fetchall()
        return [AuditOut(**dict(zip(_COLUMNS, r, strict=True))) for r in rows]

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM audit").fetchone()[0])

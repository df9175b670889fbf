"""The audit log: who (key id and team) did what (an action), to what (a job, model, pool item or key id), when, and
from where (the client address as the API sees it), in an append-only table of the API's SQLite file
(``audit`` in ``api.sqlite3``: a trigger refuses every UPDATE; rows leave only by pruning).

Bounded: after each entry the oldest rows past ``max_rows`` go, and rows older than ``max_age_days``
(``T3AR_API_AUDIT_MAX_ROWS``, ``T3AR_API_AUDIT_MAX_AGE_DAYS``), but only rows an admin has exported
(:meth:`AuditLog.export`, ``GET /audit/export``): nothing is pruned that nobody has a copy of (issue 50, N9: a
submit key wrote ~170 rows a second and pushed the history out). And rate-limited per key: past
``max_per_minute`` entries of one key in a minute (``T3AR_API_AUDIT_MAX_PER_MINUTE``) its entries are not written
one by one; one ``audit.rate_limited`` row marks where that began, and another, before the key's next entry, says
how many were left out. Read newest first, a page at a time (``before``: the previous page's last ``seq``),
filtered by team, action or key.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from t3ar.clients.api_models import AuditOut
from t3ar_services.api.sqlite_db import SqliteStore

log = logging.getLogger(__name__)

#: the actions recorded (``outcome`` is ``ok`` or ``refused``); ``request``: another route's refusal (its detail
#: names the method and path)
ACTIONS = ("job.submit", "job.readapt", "job.cancel", "job.download", "job.registration", "model.upload",
           "pool.ingest", "pool.withdraw", "pool.readmit", "contribution.withdraw", "pool.compact", "key.create",
           "key.revoke", "sign_in", "sign_out", "request", "audit.export", "audit.rate_limited")
#: the action a JSON route's refusal (403) is recorded as, by the route's endpoint name
ROUTE_ACTIONS = {"adapt": "job.submit", "readapt": "job.readapt", "cancel_job": "job.cancel",
                 "upload_model": "model.upload", "delete_pool_item": "pool.withdraw",
                 "withdraw_contribution": "contribution.withdraw", "compact": "pool.compact",
                 "create_key": "key.create", "revoke_key": "key.revoke"}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS audit (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, at TEXT NOT NULL, key_id TEXT NOT NULL, team TEXT NOT NULL,
    action TEXT NOT NULL, target TEXT NOT NULL, client TEXT NOT NULL, outcome TEXT NOT NULL, detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_at ON audit (at);
CREATE INDEX IF NOT EXISTS audit_team ON audit (team, seq);
CREATE TRIGGER IF NOT EXISTS audit_append_only BEFORE UPDATE ON audit
BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
CREATE TABLE IF NOT EXISTS audit_exported (id INTEGER PRIMARY KEY CHECK (id = 1), through INTEGER NOT NULL);
"""


_COLUMNS = tuple(AuditOut.model_fields)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class AuditLog(SqliteStore):
    schema = _SCHEMA

    def __init__(self, path: Path, *, max_rows: int, max_age_days: float, max_per_minute: int = 600,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(path)
        self.max_rows = max_rows
        self.max_age = dt.timedelta(days=max_age_days)
        self.max_per_minute = max_per_minute
        self.clock = clock
        self._recent: dict[str, deque[float]] = {}  # key id -> times of its entries written in the last minute
        self._left_out: dict[str, tuple[int, str]] = {}  # key id -> (entries not written, since when)
        self._rate_lock = threading.Lock()

    def _admit(self, key_id: str, team: str, now: dt.datetime) -> list[tuple[str, str, str]]:
        """Whether an entry of ``key_id`` is written (an empty list: not), with the ``audit.rate_limited`` rows to
        write before it: (action, target, detail) each, the entry itself last as ``("", "", "")``."""
        t = self.clock()
        with self._rate_lock:
            times = self._recent.setdefault(key_id, deque())
            while times and times[0] <= t - 60:
                times.popleft()
            if len(times) >= self.max_per_minute:
                count, since = self._left_out.get(key_id, (0, now.isoformat(timespec="milliseconds")))
                self._left_out[key_id] = (count + 1, since)
                if count == 0:  # the first one left out: say so once
                    return [("audit.rate_limited", key_id, f"more than {self.max_per_minute} entries of this key "
                             "in a minute: the next are not written one by one (T3AR_API_AUDIT_MAX_PER_MINUTE)")]
                return []
            times.append(t)
            if len(self._recent) > 10_000:  # bounded: forget keys quiet for a minute
                for k in [k for k, v in self._recent.items() if not v or v[-1] <= t - 60][:1000]:
                    self._recent.pop(k, None)
            rows = [("", "", "")]
            left = self._left_out.pop(key_id, None)
            if left is not None:
                rows.insert(0, ("audit.rate_limited", key_id, f"{left[0]} entries of this key since {left[1]} were "
                                "not written one by one (over T3AR_API_AUDIT_MAX_PER_MINUTE)"))
            return rows

    def record(self, *, key_id: str, team: str, action: str, target: str = "", client: str = "",
               outcome: str = "ok", detail: str = "") -> None:
        """Append one entry (within its key's rate) and prune past the bounds what was exported. Never raises: a
        failure is logged (the action it records already happened)."""
        now = _now()
        at = now.isoformat(timespec="milliseconds")
        rows = [(at, key_id, team, a or action, t or target[:300], client[:100], outcome if not a else "ok",
                 d or detail[:500]) for a, t, d in self._admit(key_id, team, now)]
        if not rows:
            return
        try:
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    last = 0
                    for row in rows:
                        cur = self._db.execute(
                            "INSERT INTO audit (at, key_id, team, action, target, client, outcome, detail) "
                            "VALUES (?,?,?,?,?,?,?,?)", row)
                        last = int(cur.lastrowid or 0)
                    exported = self._exported()
                    self._db.execute("DELETE FROM audit WHERE seq <= ?", (min(last - self.max_rows, exported),))
                    self._db.execute("DELETE FROM audit WHERE at < ? AND seq <= ?",
                                     ((now - self.max_age).isoformat(timespec="milliseconds"), exported))
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
        except Exception:
            log.exception("audit: could not record %s %s by %s (%s)", action, target, key_id, team)

    def _exported(self) -> int:
        """The highest seq an admin has exported (the caller holds the lock)."""
        row = self._db.execute("SELECT through FROM audit_exported WHERE id = 1").fetchone()
        return int(row[0]) if row else 0

    def export(self, *, after: int = 0, limit: int = 10_000) -> tuple[list[AuditOut], int | None]:
        """Entries after seq ``after``, oldest first, marked exported (pruning may take them from now on), and the
        ``after`` of the next batch (None: this was the last)."""
        with self._lock:
            rows = self._db.execute(f"SELECT {', '.join(_COLUMNS)} FROM audit WHERE seq > ? ORDER BY seq LIMIT ?",
                                    (after, limit)).fetchall()
            out = [AuditOut(**dict(zip(_COLUMNS, r, strict=True))) for r in rows]
            if out:
                self._db.execute("INSERT INTO audit_exported VALUES (1, ?) ON CONFLICT(id) DO UPDATE SET "
                                 "through = max(through, excluded.through)", (out[-1].seq,))
        return out, out[-1].seq if len(out) == limit else None

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

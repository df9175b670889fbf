"""The API's records of contributions, withdrawals and compaction plans (tables in ``api.sqlite3``, next to the
lineage index of :mod:`t3ar_services.api.store`, through its one connection and lock).

- ``contributions``: one row per job submitted with ``contribute=true``: ``requested`` (the job has not
  finished) -> ``pending`` (it finished; the images go to the pool) -> ``done`` (counts known), or ``none``
  (the job failed or was canceled: nothing contributed); ``withdrawing`` -> ``withdrawn`` once withdrawn.
- ``contribution_items``: pool id -> the job whose target it came from (kept after a withdrawal: a later
  job's report still names the contribution its neighbours came from).
- ``withdrawals``: every pool id withdrawn (a single delete, a contribution withdrawal, a compaction), when and
  why (:mod:`t3ar_services.api.withdrawals`).
- ``withdrawal_intents``: a withdrawal asked for and not yet recorded, written before the retriever deletes (a
  kill between the delete and the record leaves it, and a retry of the withdrawal completes the record).
- ``compaction_plans``: a dry-run's list of removals, applied at most once, exactly as listed.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from t3ar_services.api.store import Store

_SCHEMA = """
CREATE TABLE IF NOT EXISTS contributions (
    job_id TEXT PRIMARY KEY, status TEXT NOT NULL, requested_at TEXT NOT NULL, updated_at TEXT NOT NULL,
    images INTEGER, added INTEGER, skipped_exact INTEGER, skipped_near INTEGER, rejected INTEGER,
    attempts INTEGER NOT NULL DEFAULT 0, error TEXT, withdrawn_at TEXT, withdrawn_ids INTEGER
);
CREATE TABLE IF NOT EXISTS contribution_items (pool_id TEXT PRIMARY KEY, job_id TEXT NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS contribution_items_job ON contribution_items (job_id);
CREATE TABLE IF NOT EXISTS withdrawals (
    pool_id TEXT PRIMARY KEY, withdrawn_at TEXT NOT NULL, reason TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS withdrawal_intents (
    pool_id TEXT PRIMARY KEY, asked_at TEXT NOT NULL, reason TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS compaction_plans (
    id TEXT PRIMARY KEY, created_at TEXT NOT NULL, params TEXT NOT NULL, plan TEXT NOT NULL, status TEXT NOT NULL,
    applied_at TEXT, result TEXT
);
"""
_COLS = ("job_id, status, requested_at, updated_at, images, added, skipped_exact, skipped_near, rejected, attempts, "
         "error, withdrawn_at, withdrawn_ids")


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class ContributionRow:
    job_id: str
    status: str
    requested_at: str
    updated_at: str
    images: int | None
    added: int | None
    skipped_exact: int | None
    skipped_near: int | None
    rejected: int | None
    attempts: int
    error: str | None
    withdrawn_at: str | None
    withdrawn_ids: int | None


@dataclass(frozen=True)
class PlanRow:
    id: str
    created_at: str
    params: dict[str, Any]
    plan: dict[str, Any]
    status: str
    applied_at: str | None
    result: dict[str, Any] | None


def _chunks(values: Sequence[str], n: int = 500) -> list[list[str]]:
    return [list(values[i:i + n]) for i in range(0, len(values), n)]


class ContributionStore:
    """Reads and writes of the tables above (idempotent where a retry may repeat them)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        with store._lock:
            store._db.executescript(_SCHEMA)

    # --- contributions -----------------------------------------------------------------------------------
    def request(self, job_id: str) -> None:
        t = now()
        with self.store._tx() as db:
            db.execute("INSERT OR IGNORE INTO contributions (job_id, status, requested_at, updated_at) "
                       "VALUES (?, 'requested', ?, ?)", (job_id, t, t))

    def forget(self, job_id: str) -> None:
        """Drop a request whose job was never enqueued."""
        with self.store._tx() as db:
            db.execute("DELETE FROM contributions WHERE job_id = ? AND status = 'requested'", (job_id,))

    def get(self, job_id: str) -> ContributionRow | None:
        rows = self.store._all(f"SELECT {_COLS} FROM contributions WHERE job_id = ?", (job_id,))
        return ContributionRow(*rows[0]) if rows else None

    def with_status(self, *statuses: str) -> list[ContributionRow]:
        marks = ",".join("?" * len(statuses))
        return [ContributionRow(*r) for r in self.store._all(
            f"SELECT {_COLS} FROM contributions WHERE status IN ({marks}) ORDER BY requested_at", statuses)]

    def set_status(self, job_id: str, status: str, *, only_from: Sequence[str] = (), **fields: Any) -> bool:
        """Set the status (and any other columns); with ``only_from``, only when it is one of those. True if set."""
        cols = ", ".join(f"{k} = ?" for k in fields)
        sql = f"UPDATE contributions SET status = ?, updated_at = ?{', ' + cols if cols else ''} WHERE job_id = ?"
        args: list[Any] = [status, now(), *fields.values(), job_id]
        if only_from:
            sql += f" AND status IN ({','.join('?' * len(only_from))})"
            args += list(only_from)
        with self.store._tx() as db:
            return db.execute(sql, args).rowcount == 1

    def failed_attempt(self, job_id: str, error: str) -> None:
        with self.store._tx() as db:
            db.execute("UPDATE contributions SET attempts = attempts + 1, error = ?, updated_at = ? WHERE job_id = ?",
                       (error[:500], now(), job_id))

    def record_items(self, job_id: str, pool_ids: Sequence[str]) -> None:
        with self.store._tx() as db:
            db.executemany("INSERT OR IGNORE INTO contribution_items VALUES (?, ?)", [(p, job_id) for p in pool_ids])

    def items_of(self, job_id: str) -> list[str]:
        return [r[0] for r in self.store._all("SELECT pool_id FROM contribution_items WHERE job_id = ? "
                                              "ORDER BY pool_id", (job_id,))]

    def neighbour_sources(self, job_id: str) -> list[tuple[str, int]]:
        """(contributing job, pool items of its contribution this job retrieved), most used first."""
        rows = self.store._all("SELECT c.job_id, count(*) FROM lineage l JOIN contribution_items c "
                               "ON c.pool_id = l.pool_id WHERE l.job_id = ? GROUP BY c.job_id "
                               "ORDER BY count(*) DESC, c.job_id", (job_id,))
        return [(r[0], int(r[1])) for r in rows]

    # --- withdrawals and lineage -------------------------------------------------------------------------
    def record_withdrawals(self, pool_ids: Sequence[str], reason: str) -> None:
        t = now()
        with self.store._tx() as db:
            db.executemany("INSERT OR IGNORE INTO withdrawals VALUES (?, ?, ?)", [(p, t, reason) for p in pool_ids])
            db.executemany("DELETE FROM withdrawal_intents WHERE pool_id = ?", [(p,) for p in pool_ids])

    def intend_withdrawals(self, pool_ids: Sequence[str], reason: str) -> None:
        """Written before the retriever deletes (see the module docstring)."""
        t = now()
        with self.store._tx() as db:
            db.executemany("INSERT OR IGNORE INTO withdrawal_intents VALUES (?, ?, ?)",
                           [(p, t, reason) for p in pool_ids])

    def drop_intents(self, pool_ids: Sequence[str]) -> None:
        with self.store._tx() as db:
            db.executemany("DELETE FROM withdrawal_intents WHERE pool_id = ?", [(p,) for p in pool_ids])

    def intended(self, pool_id: str) -> bool:
        """Whether a withdrawal of ``pool_id`` was asked for and not recorded (interrupted)."""
        return bool(self.store._all("SELECT 1 FROM withdrawal_intents WHERE pool_id = ?", (pool_id,)))

    def withdrawal_reasons(self, pool_ids: Sequence[str]) -> dict[str, str]:
        """pool id -> why it was withdrawn, for those of ``pool_ids`` that were."""
        found: dict[str, str] = {}
        for chunk in _chunks(pool_ids):
            marks = ",".join("?" * len(chunk))
            found.update(self.store._all(f"SELECT pool_id, reason FROM withdrawals WHERE pool_id IN ({marks})",
                                         tuple(chunk)))
        return found

    def withdrawn_at(self, pool_id: str) -> str | None:
        """When ``pool_id`` was withdrawn (ISO time, UTC), or None when it never was."""
        rows = self.store._all("SELECT withdrawn_at FROM withdrawals WHERE pool_id = ?", (pool_id,))
        return str(rows[0][0]) if rows else None

    def jobs_using_any(self, pool_ids: Sequence[str]) -> list[tuple[str, str | None]]:
        """(job id, finished_at) of every indexed job whose lineage holds any of ``pool_ids``, oldest first."""
        found: dict[str, str | None] = {}
        for chunk in _chunks(pool_ids):
            marks = ",".join("?" * len(chunk))
            for job_id, finished_at in self.store._all(
                    f"SELECT DISTINCT l.job_id, j.finished_at FROM lineage l JOIN lineage_jobs j ON j.job_id = "
                    f"l.job_id WHERE l.pool_id IN ({marks})", tuple(chunk)):
                found[job_id] = finished_at
        return sorted(found.items(), key=lambda kv: (kv[1] or "", kv[0]))

    # --- compaction plans --------------------------------------------------------------------------------
    def add_plan(self, plan_id: str, params: dict[str, Any], plan: dict[str, Any]) -> None:
        with self.store._tx() as db:
            db.execute("INSERT INTO compaction_plans VALUES (?, ?, ?, ?, 'planned', NULL, NULL)",
                       (plan_id, now(), json.dumps(params), json.dumps(plan)))

    def get_plan(self, plan_id: str) -> PlanRow | None:
        rows = self.store._all("SELECT * FROM compaction_plans WHERE id = ?", (plan_id,))
        if not rows:
            return None
        r = rows[0]
        return PlanRow(r[0], r[1], json.loads(r[2]), json.loads(r[3]), r[4], r[5], json.loads(r[6]) if r[6] else None)

    def finish_plan(self, plan_id: str, result: dict[str, Any]) -> None:
        with self.store._tx() as db:
            db.execute("UPDATE compaction_plans SET status = 'applied', applied_at = ?, result = ? WHERE id = ?",
                       (now(), json.dumps(result), plan_id))

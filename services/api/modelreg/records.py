"""The registration state of each job and the version tags still owed to the registry, in the API's SQLite file.

A job submitted while registration is on gets a row (``pending``) with the name and alias it will register
under; the registrar moves it to ``done`` (run, version), ``failed`` (after its attempts, with the reason) or
``skipped`` (the job did not finish). Tags owed to a job's version (``t3ar.stale...`` after a withdrawal,
``t3ar.superseded_by`` after its re-run registered) wait in ``registration_tags`` until the registry took them.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass

from t3ar_services.api.sqlite_db import SqliteStore

_SCHEMA = """
CREATE TABLE IF NOT EXISTS registrations (
    job_id TEXT PRIMARY KEY, name TEXT NOT NULL, alias TEXT, state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0, next_at REAL NOT NULL DEFAULT 0, error TEXT,
    experiment_id TEXT, run_id TEXT, version TEXT, updated_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS registrations_state ON registrations (state, next_at);
CREATE TABLE IF NOT EXISTS registration_tags (
    job_id TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, done INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, key)
) WITHOUT ROWID;
"""

STATES = ("pending", "done", "failed", "skipped")


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Registration:
    job_id: str
    name: str
    alias: str | None
    state: str
    attempts: int
    next_at: float
    error: str | None
    experiment_id: str | None
    run_id: str | None
    version: str | None
    updated_at: str


class RegistrationStore(SqliteStore):
    schema = _SCHEMA

    def request(self, job_id: str, name: str, alias: str | None) -> None:
        """The job registers as ``name`` (and sets ``alias``) once it finished (a second call is no change)."""
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO registrations (job_id, name, alias, state, updated_at) "
                       "VALUES (?,?,?,'pending',?)", (job_id, name, alias, now_iso()))

    def forget(self, job_id: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM registrations WHERE job_id = ?", (job_id,))
            db.execute("DELETE FROM registration_tags WHERE job_id = ?", (job_id,))

    def get(self, job_id: str) -> Registration | None:
        rows = self._all("SELECT * FROM registrations WHERE job_id = ?", (job_id,))
        return Registration(*rows[0]) if rows else None

    def due(self, at: float | None = None) -> list[Registration]:
        """Pending registrations whose next attempt is due, oldest first."""
        rows = self._all("SELECT * FROM registrations WHERE state = 'pending' AND next_at <= ? ORDER BY updated_at",
                         (time.time() if at is None else at,))
        return [Registration(*r) for r in rows]

    def failed_attempt(self, job_id: str, error: str, next_at: float | None) -> None:
        """One more failed attempt; ``next_at`` None: no attempt is left (failed)."""
        with self._tx() as db:
            db.execute("UPDATE registrations SET attempts = attempts + 1, error = ?, next_at = ?, state = ?, "
                       "updated_at = ? WHERE job_id = ? AND state = 'pending'",
                       (error, next_at or 0, "pending" if next_at is not None else "failed", now_iso(), job_id))

    def done(self, job_id: str, experiment_id: str, run_id: str, version: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE registrations SET state = 'done', attempts = attempts + 1, error = NULL, "
                       "experiment_id = ?, run_id = ?, version = ?, updated_at = ? WHERE job_id = ?",
                       (experiment_id, run_id, version, now_iso(), job_id))

    def skip(self, job_id: str, why: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE registrations SET state = 'skipped', error = ?, updated_at = ? "
                       "WHERE job_id = ? AND state = 'pending'", (why, now_iso(), job_id))

    def retry(self, job_id: str) -> bool:
        """A failed registration pending again (attempts from zero); False when it was not failed."""
        with self._tx() as db:
            cur = db.execute("UPDATE registrations SET state = 'pending', attempts = 0, next_at = 0, updated_at = ? "
                             "WHERE job_id = ? AND state = 'failed'", (now_iso(), job_id))
            return bool(cur.rowcount)

    # --- tags owed to a job's version ---------------------------------------------------------------------
    def owe_tags(self, job_id: str, tags: dict[str, str], *, replace: bool = False) -> None:
        """Tags to set on the job's version; ``replace``: a key owed (or set) before takes the new value, else the
        first value stays (a stale mark keeps its first time)."""
        verb = "INSERT OR REPLACE" if replace else "INSERT OR IGNORE"
        with self._tx() as db:
            db.executemany(f"{verb} INTO registration_tags VALUES (?,?,?,0)",
                           [(job_id, k, v) for k, v in tags.items()])

    def owed(self) -> dict[str, dict[str, str]]:
        """Tags not yet set, by job, of jobs whose version exists."""
        rows = self._all("SELECT t.job_id, t.key, t.value FROM registration_tags t JOIN registrations r "
                         "ON r.job_id = t.job_id WHERE t.done = 0 AND r.state = 'done' ORDER BY t.job_id, t.key")
        out: dict[str, dict[str, str]] = {}
        for job_id, key, value in rows:
            out.setdefault(job_id, {})[key] = value
        return out

    def tags_set(self, job_id: str, tags: dict[str, str]) -> None:
        with self._tx() as db:
            db.executemany("UPDATE registration_tags SET done = 1 WHERE job_id = ? AND key = ? AND value = ?",
                           [(job_id, k, v) for k, v in tags.items()])

    def tags_of(self, job_id: str) -> dict[str, tuple[str, bool]]:
        """Every tag owed to (or set on) the job's version: key -> (value, set in the registry yet)."""
        return {r[0]: (r[1], bool(r[2])) for r in self._all(
            "SELECT key, value, done FROM registration_tags WHERE job_id = ? ORDER BY key", (job_id,))}

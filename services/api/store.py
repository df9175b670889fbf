"""The API's own records, in SQLite (``<data_dir>/api.sqlite3``): base models, submitted jobs, the lineage index
(pool id -> finished jobs whose adaptation retrieved it) and the serving formats made of finished jobs' checkpoints
(sha256, size, parity figures).

Redis holds the live state of jobs (status, progress) for ``result_ttl`` seconds; these records outlive it.
The API is the only writer: a worker uploads a job's lineage over HTTP (``PUT /internal/jobs/<id>/result``,
see :mod:`t3ar_services.common.job_contract`), and the API writes ``artifacts/<job>/lineage.json`` itself and
indexes it (:meth:`Store.index_lineage`); workers share no disk with the API, so no SQLite file is ever shared
across machines.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ConfigDict

from t3ar.clients.api_models import ModelOut
from t3ar_services.api.sqlite_db import SqliteStore

_SCHEMA = """
CREATE TABLE IF NOT EXISTS models (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, sha256 TEXT NOT NULL, size INTEGER NOT NULL,
    arch TEXT NOT NULL, image_size INTEGER NOT NULL, classes TEXT NOT NULL, uploaded_at TEXT NOT NULL,
    feature_dim INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, model_id TEXT NOT NULL, parent_id TEXT, created_at TEXT NOT NULL,
    config TEXT NOT NULL, target_dir TEXT NOT NULL, n_images INTEGER NOT NULL, labelled INTEGER NOT NULL,
    skipped INTEGER NOT NULL DEFAULT 0, secret_sha256 TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_created ON jobs (created_at);
CREATE INDEX IF NOT EXISTS jobs_parent ON jobs (parent_id);
CREATE TABLE IF NOT EXISTS lineage_jobs (
    job_id TEXT PRIMARY KEY, finished_at TEXT, checkpoint_sha256 TEXT, n_pool_ids INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS lineage (
    pool_id TEXT NOT NULL, job_id TEXT NOT NULL, PRIMARY KEY (pool_id, job_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS exports (
    job_id TEXT NOT NULL, format TEXT NOT NULL, sha256 TEXT NOT NULL, size INTEGER NOT NULL,
    created_at TEXT NOT NULL, parity TEXT NOT NULL, PRIMARY KEY (job_id, format)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS owners (
    kind TEXT NOT NULL, id TEXT NOT NULL, team TEXT NOT NULL, key_id TEXT NOT NULL, PRIMARY KEY (kind, id, team)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS owners_team ON owners (kind, team, id);
CREATE TABLE IF NOT EXISTS model_uploads (
    id TEXT NOT NULL, team TEXT NOT NULL, name TEXT NOT NULL, uploaded_at TEXT NOT NULL, PRIMARY KEY (id, team)
) WITHOUT ROWID;
"""


class ModelRow(ModelOut):
    """A base model as the store keeps it: what the API answers about it, and its feature width (its bank's)."""

    model_config = ConfigDict(frozen=True)

    feature_dim: int


@dataclass(frozen=True)
class JobRow:
    id: str
    model_id: str
    parent_id: str | None
    created_at: str
    config: dict[str, Any]
    target_dir: str
    n_images: int
    labelled: bool
    skipped: int
    secret_sha256: str  # the sha256 of the job's own secret (its worker routes need the secret)


@dataclass(frozen=True)
class ExportRow:
    """A finished job's checkpoint exported to ``format`` (``artifacts/<job>/model.<format>``)."""

    job_id: str
    format: str
    sha256: str
    size: int
    created_at: str
    parity: dict[str, Any]  # t3ar.export.Parity.as_dict(): max_abs_diff, top1_agreement, images, images_source


class Store(SqliteStore):
    """The models, jobs and exports, in the API's SQLite file (the API's traffic is small; SQLite serialises writers
    anyway)."""

    schema = _SCHEMA

    # --- models ------------------------------------------------------------------------------------------
    def add_model(self, m: ModelRow) -> bool:
        """Insert; False when the id exists already (same file uploaded twice)."""
        with self._tx() as db:
            cur = db.execute("INSERT OR IGNORE INTO models (id, name, sha256, size, arch, image_size, classes, "
                             "uploaded_at, feature_dim) VALUES (?,?,?,?,?,?,?,?,?)",
                             (m.id, m.name, m.sha256, m.size, m.arch, m.image_size, json.dumps(m.classes),
                              m.uploaded_at, m.feature_dim))
            return cur.rowcount == 1

    def add_model_upload(self, model_id: str, team: str, name: str, uploaded_at: str) -> bool:
        """A team's own upload of a model (its name for it, when it uploaded it: the same file uploaded by two teams
        is one model, and neither sees the other's name or time); False when the team had uploaded it before."""
        with self._tx() as db:
            cur = db.execute("INSERT OR IGNORE INTO model_uploads VALUES (?,?,?,?)",
                             (model_id, team, name, uploaded_at))
            return cur.rowcount == 1

    def model_uploads(self, team: str) -> dict[str, tuple[str, str]]:
        """model id -> (name, uploaded_at) of ``team``'s own uploads."""
        return {r[0]: (r[1], r[2]) for r in self._all("SELECT id, name, uploaded_at FROM model_uploads WHERE team = ?",
                                                      (team,))}

    def get_model(self, model_id: str) -> ModelRow | None:
        rows = self._all("SELECT * FROM models WHERE id = ?", (model_id,))
        return _model(rows[0]) if rows else None

    def list_models(self, team: str | None = None) -> list[ModelRow]:
        """Every model, or with ``team`` that team's."""
        owned, args = ("", ()) if team is None else (_OWNED.format(kind="model", col="models.id"), (team,))
        return [_model(r) for r in self._all(f"SELECT * FROM models WHERE 1=1{owned} ORDER BY uploaded_at, id", args)]

    # --- jobs --------------------------------------------------------------------------------------------
    def add_job(self, j: JobRow) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO jobs (id, model_id, parent_id, created_at, config, target_dir, n_images, labelled, "
                       "skipped, secret_sha256) VALUES (?,?,?,?,?,?,?,?,?,?)",
                       (j.id, j.model_id, j.parent_id, j.created_at, json.dumps(j.config), j.target_dir,
                        j.n_images, int(j.labelled), j.skipped, j.secret_sha256))

    def delete_job(self, job_id: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
            db.execute("DELETE FROM owners WHERE kind = 'job' AND id = ?", (job_id,))

    def job_folders(self) -> set[str]:
        """The names of the ``jobs/<name>`` folders job records use: each job's own and the target folders re-runs
        share."""
        names = {str(r[0]) for r in self._all("SELECT id FROM jobs")}
        for (target,) in self._all("SELECT DISTINCT target_dir FROM jobs"):
            parts = Path(str(target)).parts
            if len(parts) > 1 and parts[0] == "jobs":
                names.add(parts[1])
        return names

    def get_job(self, job_id: str) -> JobRow | None:
        rows = self._all("SELECT * FROM jobs WHERE id = ?", (job_id,))
        return _job(rows[0]) if rows else None

    def list_jobs(self, *, limit: int, before: str | None = None, team: str | None = None) -> list[JobRow]:
        """Newest first; ``before`` is the (created_at, id) cursor of the previous page's last job; ``team``:
        that team's jobs only."""
        owned, args = ("", ()) if team is None else (_OWNED.format(kind="job", col="jobs.id"), (team,))
        if before is None:
            rows = self._all(f"SELECT * FROM jobs WHERE 1=1{owned} ORDER BY created_at DESC, id DESC LIMIT ?",
                             (*args, limit))
        else:
            ref = self.get_job(before)
            if ref is None:
                return []
            rows = self._all(f"SELECT * FROM jobs WHERE (created_at, id) < (?, ?){owned} ORDER BY created_at DESC, "
                             "id DESC LIMIT ?", (ref.created_at, ref.id, *args, limit))
        return [_job(r) for r in rows]

    def reruns_of(self, job_id: str) -> list[JobRow]:
        """The jobs that re-run ``job_id`` (its readapts), newest first."""
        rows = self._all("SELECT * FROM jobs WHERE parent_id = ? ORDER BY created_at DESC, id DESC", (job_id,))
        return [_job(r) for r in rows]

    def count_jobs(self, team: str | None = None) -> int:
        if team is None:
            return int(self._all("SELECT COUNT(*) FROM jobs")[0][0])
        return int(self._all("SELECT COUNT(*) FROM owners WHERE kind = 'job' AND team = ?", (team,))[0][0])

    # --- owners (teams) ----------------------------------------------------------------------------------
    def add_owner(self, kind: str, item_id: str, team: str, key_id: str) -> None:
        """``item_id`` (a ``job`` or a ``model``) belongs to ``team`` (made by key ``key_id``). A job has one team;
        a model (its id is its content's) every team that uploaded it."""
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO owners VALUES (?,?,?,?)", (kind, item_id, team, key_id))

    def teams_of(self, kind: str, item_id: str) -> set[str]:
        """The teams ``item_id`` belongs to (empty: made without an owner, seen by admins only)."""
        return {r[0] for r in self._all("SELECT team FROM owners WHERE kind = ? AND id = ?", (kind, item_id))}

    # --- lineage -----------------------------------------------------------------------------------------
    def indexed_jobs(self) -> set[str]:
        return {r[0] for r in self._all("SELECT job_id FROM lineage_jobs")}

    def index_lineage(self, job_id: str, pool_ids: list[str], *, finished_at: str | None,
                      checkpoint_sha256: str | None) -> None:
        """Record one finished job's retrieved pool ids (idempotent)."""
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO lineage_jobs VALUES (?,?,?,?)",
                       (job_id, finished_at, checkpoint_sha256, len(pool_ids)))
            db.executemany("INSERT OR IGNORE INTO lineage VALUES (?,?)", [(p, job_id) for p in pool_ids])

    def jobs_using(self, pool_id: str) -> list[tuple[str, str | None]]:
        """(job id, finished_at) of every indexed job whose lineage contains ``pool_id``."""
        rows = self._all("SELECT l.job_id, j.finished_at FROM lineage l JOIN lineage_jobs j ON j.job_id = l.job_id "
                         "WHERE l.pool_id = ? ORDER BY j.finished_at, l.job_id", (pool_id,))
        return [(r[0], r[1]) for r in rows]


    # --- exports -----------------------------------------------------------------------------------------
    def add_export(self, e: ExportRow) -> None:
        """Record (or replace) the export of one job's checkpoint to one format."""
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO exports VALUES (?,?,?,?,?,?)",
                       (e.job_id, e.format, e.sha256, e.size, e.created_at, json.dumps(e.parity)))

    def exports_of(self, job_id: str) -> dict[str, ExportRow]:
        """The job's recorded exports by format."""
        rows = self._all("SELECT * FROM exports WHERE job_id = ? ORDER BY format", (job_id,))
        return {r[1]: ExportRow(r[0], r[1], r[2], int(r[3]), r[4], dict(json.loads(r[5]))) for r in rows}


_OWNED = " AND EXISTS (SELECT 1 FROM owners o WHERE o.kind = '{kind}' AND o.id = {col} AND o.team = ?)"


def _model(r: tuple[Any, ...]) -> ModelRow:
    classes = list(json.loads(r[6]))
    return ModelRow(id=r[0], name=r[1], sha256=r[2], size=int(r[3]), arch=r[4], image_size=int(r[5]),
                    num_classes=len(classes), classes=classes, uploaded_at=r[7], feature_dim=int(r[8]))


def _job(r: tuple[Any, ...]) -> JobRow:
    return JobRow(r[0], r[1], r[2], r[3], dict(json.loads(r[4])), r[5], int(r[6]), bool(r[7]), int(r[8]), r[9])

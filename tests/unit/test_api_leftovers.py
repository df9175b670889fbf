"""A submission cut by an API crash (its archive saved, part of it extracted, no job record yet) left
``jobs/<id>/`` on disk forever. The API's sweep (at start-up and every sweep_interval) removes such a folder once
nothing writes it and no record names it; a job's folder, a re-run's shared target and a submission in progress
stay."""

from __future__ import annotations

import os
import time
from pathlib import Path

from console_kit import app_for, finished_job, new_pool, settings_for, signed_in
from fastapi.testclient import TestClient

from t3ar_services.api.main import sweep_once

USER = {"Authorization": "Bearer user-t"}


def _cut_submission(jobs: Path, job_id: str, age: float) -> Path:
    """What a submission killed during extraction leaves: the archive and a partial extraction, ``age`` s old."""
    folder = jobs / job_id
    (folder / "target" / "imgs").mkdir(parents=True)
    (folder / "upload").write_bytes(b"PK\x03\x04" + b"\0" * 1000)
    (folder / "target" / "imgs" / "a0.png").write_bytes(b"\x89PNG half")
    then = time.time() - age
    for p in (folder / "target" / "imgs" / "a0.png", folder / "target" / "imgs", folder / "target",
              folder / "upload", folder):
        os.utime(p, (then, then))
    return folder


def test_the_sweep_removes_job_folders_a_crash_left_and_nothing_else(tmp_path: Path) -> None:
    app = app_for(settings_for(tmp_path), new_pool())
    with TestClient(app) as client:
        state = app.state.api
        job_id = finished_job(client, tmp_path, signed_in(client, "user-t"))
        jobs = tmp_path / "data" / "jobs"
        rerun = client.post(f"/jobs/{job_id}/readapt", headers=USER)
        assert rerun.status_code == 202, rerun.text
        own = jobs / job_id
        for p in (own, *own.rglob("*")):  # a job as old as a leftover: its record keeps it
            os.utime(p, (time.time() - 7200,) * 2)
        left = _cut_submission(jobs, "c" * 32, age=3600)
        fresh = _cut_submission(jobs, "d" * 32, age=5)  # changed seconds ago: maybe written now
        writing = _cut_submission(jobs, "e" * 32, age=3600)
        state.submissions.add("e" * 32)  # a submission of this process is writing it
        sweep_once(state)
        assert not left.exists()
        assert own.is_dir() and (jobs / job_id / "target").is_dir()  # the job's (and its re-run's) target
        assert fresh.is_dir() and writing.is_dir()
        state.submissions.discard("e" * 32)
        sweep_once(state)
        assert not writing.exists() and fresh.is_dir() and own.is_dir()
        assert client.get(f"/jobs/{job_id}", headers=USER).status_code == 200
        assert client.get(f"/jobs/{rerun.json()['id']}", headers=USER).status_code == 200

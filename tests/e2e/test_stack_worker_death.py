"""A worker killed mid-job (parent and work-horse, SIGKILL: a lost machine) leaves its job failed, not
"started" forever; the embedded stack restarts the worker and the next job runs."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from stack_helpers import FAST_JOB, LONG_JOB, Stack, wait_for


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_killed_worker_fails_the_job_and_stack_recovers(stack: Stack, model_id: str, pool_ids: list[str],
                                                         labelled_zip: Path) -> None:
    with stack.api() as api:
        accepted = api.adapt(labelled_zip, model_id, LONG_JOB)
        job = wait_for(lambda: (j := api.job(accepted.id)) and getattr(j.progress, "phase", None) == "adapting"
                       and j, 120, "the job to be adapting")
        horse = int(job.progress.pid)
        worker = stack.pids()["worker-1"]
        assert horse != worker
        _kill(worker)
        _kill(horse)

        failed = wait_for(lambda: (j := api.job(accepted.id)).status != "started" and j, 60,
                          "the abandoned job to leave 'started'")
        assert failed.status == "failed", failed
        assert "worker running this job stopped" in failed.error
        assert f"/jobs/{accepted.id}/readapt" in failed.error
        assert not (stack.data_dir / "api" / "artifacts" / accepted.id / "lineage.json").exists()

        wait_for(lambda: stack.pids()["worker-1"] != worker, 30, "`t3ar up` to restart the worker")
        nxt = api.adapt(labelled_zip, model_id, {**FAST_JOB, "mode": "test"})
        assert api.wait(nxt.id, poll=0.2, timeout=180).status == "finished"


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_killing_only_the_worker_takes_its_work_horse_too(stack: Stack, model_id: str, pool_ids: list[str],
                                                          labelled_zip: Path) -> None:
    """Issue 29 F6: kill -9 of the worker parent alone. Its work horse dies with it (no orphan running the job
    with ppid 1), the failed job's progress stops, and the restarted worker serves its metrics port."""
    import httpx

    with stack.api() as api:
        accepted = api.adapt(labelled_zip, model_id, LONG_JOB)
        job = wait_for(lambda: (j := api.job(accepted.id)) and getattr(j.progress, "phase", None) == "adapting"
                       and j, 120, "the job to be adapting")
        horse, worker = int(job.progress.pid), stack.pids()["worker-1"]
        assert horse != worker and _alive(horse)
        _kill(worker)
        wait_for(lambda: not _alive(horse), 15, "the work horse to die with its worker")
        failed = wait_for(lambda: (j := api.job(accepted.id)).status != "started" and j, 60,
                          "the abandoned job to leave 'started'")
        assert failed.status == "failed", failed
        step = getattr(failed.progress, "step", None)
        time.sleep(3)
        assert getattr(api.job(accepted.id).progress, "step", None) == step  # no more progress
        wait_for(lambda: stack.pids()["worker-1"] != worker, 30, "`t3ar up` to restart the worker")
        metrics = stack.info["worker_metrics"][0]

        def served() -> bool:
            try:
                return httpx.get(metrics, timeout=3).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(served, 120, "the restarted worker to serve its metrics")
        assert "t3ar_worker_jobs_total" in httpx.get(metrics, timeout=5).text

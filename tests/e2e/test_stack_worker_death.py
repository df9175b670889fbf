"""A worker killed mid-job (parent and work-horse, SIGKILL: a lost machine) leaves its job failed, not
"started" forever; the embedded stack restarts the worker and the next job runs."""

from __future__ import annotations

import os
import signal
from pathlib import Path

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
        job = wait_for(lambda: (j := api.job(accepted["id"])) and (j.get("progress") or {}).get("phase") == "adapting"
                       and j, 120, "the job to be adapting")
        horse = int(job["progress"]["pid"])
        worker = stack.pids()["worker-1"]
        assert horse != worker
        _kill(worker)
        _kill(horse)

        failed = wait_for(lambda: (j := api.job(accepted["id"]))["status"] != "started" and j, 60,
                          "the abandoned job to leave 'started'")
        assert failed["status"] == "failed", failed
        assert "worker running this job stopped" in failed["error"]
        assert f"/jobs/{accepted['id']}/readapt" in failed["error"]
        assert not (stack.data_dir / "api" / "artifacts" / accepted["id"] / "lineage.json").exists()

        wait_for(lambda: stack.pids()["worker-1"] != worker, 30, "`t3ar up` to restart the worker")
        nxt = api.adapt(labelled_zip, model_id, {**FAST_JOB, "mode": "test"})
        assert api.wait(nxt["id"], poll=0.2, timeout=180)["status"] == "finished"

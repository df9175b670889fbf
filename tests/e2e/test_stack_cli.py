"""The user-facing commands against the stack: models upload, submit (follow + download), jobs, withdraw."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from stack_helpers import FAST_JOB, ROOT, Stack, inherited_path, tiny_checkpoint

from t3ar.models.checkpoint import load_checkpoint


def _cli(stack: Stack, *args: str, admin: bool = False) -> subprocess.CompletedProcess[str]:
    t = stack.info["tokens"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "shared"), str(ROOT), *inherited_path()]),
               T3AR_API_URL=stack.info["api_url"], T3AR_API_TOKEN=t["api_token"])
    if admin:
        env["T3AR_API_ADMIN_TOKEN"] = t["api_admin_token"]
    return subprocess.run([sys.executable, "-m", "t3ar.cli.job_cmd", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)


def test_submit_follow_download_and_withdraw(stack: Stack, pool_ids: list[str], labelled_zip: Path,
                                            tmp_path: Path) -> None:
    ckpt = tiny_checkpoint(tmp_path / "cli.pt", ("blue", "green", "red"))
    up = _cli(stack, "models", "upload", str(ckpt), "--json")
    assert up.returncode == 0, up.stderr
    model_id = json.loads(up.stdout)["id"]
    assert model_id in _cli(stack, "models", "list").stdout

    out = tmp_path / "adapted.pt"
    extra = {k: v for k, v in FAST_JOB.items() if k not in ("k", "epochs", "method")}
    sub = _cli(stack, "submit", str(labelled_zip), "--model", model_id, "--method", "t3ar", "--k", "2",
               "--epochs", "1", "--mode", "test", "--config", json.dumps(extra), "--out", str(out), "--json")
    assert sub.returncode == 0, sub.stderr
    job = json.loads(sub.stdout)
    assert job["status"] == "finished" and job["checkpoint_path"] == str(out)
    _, info = load_checkpoint(out)
    assert info.lineage.pool_ids

    listed = _cli(stack, "jobs", "list")
    assert job["id"] in listed.stdout
    report = json.loads(_cli(stack, "jobs", "report", job["id"], "--json").stdout)
    assert report["job_id"] == job["id"]
    summary = _cli(stack, "jobs", "report", job["id"]).stdout  # read by the report's typed fields
    assert summary.startswith(f"job {job['id']}: ") and f"checkpoint sha256: {report['checkpoint_sha256']}" in summary

    denied = _cli(stack, "withdraw", info.lineage.pool_ids[0])  # user token only
    assert denied.returncode == 1 and "admin token" in denied.stderr
    wd = _cli(stack, "withdraw", info.lineage.pool_ids[0], "--readapt", "--json", admin=True)
    assert wd.returncode == 0, wd.stderr
    results = json.loads(wd.stdout)
    assert job["id"] in [j["job_id"] for j in results[0]["jobs"]]
    readapt = next(r for r in results if r.get("readapt_of") == job["id"])
    followed = _cli(stack, "jobs", "follow", readapt["id"], "--json")
    assert followed.returncode == 0 and json.loads(followed.stdout)["parent_id"] == job["id"]


def test_cli_errors_are_one_line(stack: Stack, tmp_path: Path) -> None:
    res = _cli(stack, "jobs", "show", "nope")
    # the API's hint said as the command that does it (issue 50), not `GET /jobs`
    assert res.returncode == 1 and res.stderr.startswith("Error: no job 'nope'; list them with `t3ar jobs list`")
    res = _cli(stack, "submit", str(tmp_path), "--model", "missing")
    assert res.returncode == 1 and "no model 'missing'" in res.stderr

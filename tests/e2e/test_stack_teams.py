"""Teams on the real stack: an admin makes two teams' keys with the CLI; each team's key sees only its own jobs
through the API, the CLI and the console; the audit log records who did what; a revoked key stops at once (its
console session too). Tiny ``source`` jobs on the session's stack."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from stack_helpers import ROOT, Stack, inherited_path, tiny_checkpoint

from t3ar.clients.api import ApiClient


def _cli(stack: Stack, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "shared"), str(ROOT), *inherited_path()]),
               T3AR_API_URL=stack.info["api_url"], T3AR_API_TOKEN=token, T3AR_API_ADMIN_TOKEN=token)
    return subprocess.run([sys.executable, "-m", "t3ar.cli.main", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)


def _make_key(stack: Stack, team: str, role: str) -> tuple[str, str]:
    made = _cli(stack, stack.info["tokens"]["api_admin_token"], "keys", "create", "--team", team, "--role", role)
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    key_id = re.search(r"key (k[0-9a-f]+):", made.stderr).group(1)  # type: ignore[union-attr]
    assert key.startswith(f"t3ar_{key_id}_"), made.stdout
    return key_id, key


def _finished_job(stack: Stack, key: str, target: Path, ckpt: Path) -> str:
    with ApiClient(stack.info["api_url"], key, retries=2) as api:
        model_id = api.upload_model(ckpt, "team model").id
        job = api.wait(api.adapt(target, model_id, {"method": "source"}).id, timeout=240)
        assert job.status == "finished", job
        return str(job.id)


def _console(stack: Stack, key: str) -> httpx.Client:
    client = httpx.Client(base_url=stack.info["api_url"], timeout=30)
    page = client.get("/ui/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
    signed = client.post("/ui/login", data={"csrf": csrf, "token": key, "next": "/ui/jobs"})
    assert signed.status_code == 303 and signed.headers["location"] == "/ui/jobs", signed.text
    return client


def _get(stack: Stack, key: str, path: str) -> httpx.Response:
    return httpx.get(stack.info["api_url"] + path, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def test_two_teams_see_only_their_own_jobs(stack: Stack, labelled_zip: Path, tmp_path: Path) -> None:
    admin = stack.info["tokens"]["api_admin_token"]
    vision_id, vision = _make_key(stack, "vision", "submit")
    audio_id, audio = _make_key(stack, "audio", "submit")
    listed = _cli(stack, admin, "keys", "list", "--json")
    assert {vision_id, audio_id} <= {k["id"] for k in json.loads(listed.stdout)} and vision not in listed.stdout

    ckpt = tiny_checkpoint(tmp_path / "team.pt")
    vision_job = _finished_job(stack, vision, labelled_zip, ckpt)
    audio_job = _finished_job(stack, audio, labelled_zip, ckpt)  # the same model file: it belongs to both teams

    # the API
    for key, mine, theirs in ((vision, vision_job, audio_job), (audio, audio_job, vision_job)):
        ids = [j["id"] for j in _get(stack, key, "/jobs?limit=200").json()["jobs"]]
        assert mine in ids and theirs not in ids
        for path in (f"/jobs/{theirs}", f"/jobs/{theirs}/checkpoint", f"/jobs/{theirs}/report"):
            resp = _get(stack, key, path)
            assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found", (path, resp.text)
        assert _get(stack, key, f"/jobs/{mine}/checkpoint").status_code == 200
    admin_ids = [j["id"] for j in _get(stack, admin, "/jobs?limit=200").json()["jobs"]]
    assert {vision_job, audio_job} <= set(admin_ids)
    assert _get(stack, vision, "/audit").status_code == 403

    # the CLI
    mine = _cli(stack, vision, "jobs", "list", "--limit", "200")
    assert mine.returncode == 0 and vision_job in mine.stdout and audio_job not in mine.stdout
    other = _cli(stack, vision, "jobs", "show", audio_job)
    assert other.returncode == 1 and "no job" in other.stderr

    # the console
    console = _console(stack, audio)
    try:
        page = console.get("/ui/jobs")
        assert page.status_code == 200 and audio_job in page.text and vision_job not in page.text
        assert console.get(f"/ui/jobs/{vision_job}").status_code == 404
        assert console.get(f"/ui/jobs/{audio_job}").status_code == 200
        assert console.get("/ui/audit").status_code == 403
        # revoked: the API and the console session refuse it from the next request on
        revoked = _cli(stack, admin, "keys", "revoke", audio_id)
        assert revoked.returncode == 0 and "revoked" in revoked.stdout, revoked.stderr
        assert _get(stack, audio, "/jobs").status_code == 401
        gone = console.get("/ui/jobs")
        assert gone.status_code == 303 and gone.headers["location"].startswith("/ui/login")
    finally:
        console.close()

    # the audit log, as the admin reads it (CLI and API)
    out = _cli(stack, admin, "audit", "--team", "vision", "--limit", "100", "--json")
    assert out.returncode == 0, out.stderr
    entries: list[dict[str, Any]] = json.loads(out.stdout)["entries"]
    did = {(e["action"], e["target"]) for e in entries if e["key_id"] == vision_id}
    assert {("job.submit", vision_job), ("job.download", vision_job)} <= did
    assert any(a == "model.upload" for a, _ in did)
    assert all(e["client"] == "127.0.0.1" for e in entries)
    audio_log = _get(stack, admin, "/audit?team=audio&limit=100").json()["entries"]
    assert {"sign_in", "job.submit", "model.upload"} <= {e["action"] for e in audio_log if e["key_id"] == audio_id}
    keys_log = _get(stack, admin, "/audit?action=key.revoke").json()["entries"]
    assert keys_log[0]["target"] == audio_id and keys_log[0]["key_id"] == "token:admin"

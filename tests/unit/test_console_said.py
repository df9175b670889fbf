"""Issue 50, part 2 (the walk): what the console's pages and ``t3ar jobs show`` say is what happened. A job whose
holdout winner is the base model says so as its headline (page, list, ``jobs show``); a win the holdout cannot tell
from noise says so with the holdout that would; stale marks are on every download, the list and the labelled
neighbours; a re-run job offers no second readapt; progress names the candidate and what a queued job waits for."""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
from click.testing import CliRunner
from console_kit import app_for, finished_job, new_pool, settings_for, signed_in
from console_kit import client as client  # the fixtures
from console_kit import pool as pool
from fastapi.testclient import TestClient
from uvicorn_kit import serving

from t3ar.acceptance import images_to_resolve, paired_diff
from t3ar.cli.job_cmd import jobs
from t3ar.clients.api_models import Contribution, JobOut, Progress, TargetInfo
from t3ar.job_words import progress_words
from t3ar_services.common.job_contract import REPORT_FILE, artifacts_dir

USER = {"Authorization": "Bearer user-t"}
#: a holdout of 98 images in 7 classes where the base model beat t3ar by one image: a CI that includes 0
ACCEPTANCE: dict[str, Any] = {
    "rule": "argmax", "winner": "source", "reason": "highest top-1 on the holdout (50.0 %)", "n": 98,
    "ci": "wilson 95 %", "paired_ci": "paired bootstrap 95 % (2000 resamples, seed 0)", "steps": [], "classes": 7,
    "candidates": [
        {"name": "source", "method": "source", "top1": 0.5, "ci": [0.4, 0.6], "n": 98, "seconds": 1.0},
        {"name": "t3ar", "method": "t3ar", "top1": 0.49, "ci": [0.39, 0.59], "n": 98, "seconds": 9.0,
         "vs_source": {"points": -1.02, "lo": -6.1, "hi": 4.1}}],
    "runner_up": {"name": "t3ar", "points": 1.02, "lo": -4.1, "hi": 6.1}}


def _with_acceptance(tmp_path: Path, job_id: str, acceptance: dict[str, Any]) -> None:
    """The finished job's report as a worker writes it for a job with a holdout."""
    path = artifacts_dir(tmp_path / "data", job_id) / REPORT_FILE
    report = json.loads(path.read_text())
    path.write_text(json.dumps({**report, "acceptance": acceptance}))


def test_a_base_model_winner_is_the_headline_and_a_one_image_win_is_within_noise(client: TestClient,
                                                                                 tmp_path: Path) -> None:
    """The page, the list and ``jobs show`` said "t3ar · validated" while the .pt was the unchanged base model,
    and a winner by one image of 98 was presented as a win."""
    csrf = signed_in(client)
    job_id = finished_job(client, tmp_path, csrf)
    adapted = client.get(f"/ui/jobs/{job_id}").text
    assert 'id="returned"' in adapted and "the base model" not in adapted and 'id="noise"' not in adapted
    _with_acceptance(tmp_path, job_id, ACCEPTANCE)
    page = client.get(f"/ui/jobs/{job_id}").text
    headline = page[page.index('id="returned"'):page.index("</p>", page.index('id="returned"'))]
    assert "the base model, unchanged" in headline and "not an adapted model" in headline
    need = images_to_resolve(98, -4.1, 6.1)
    assert need is not None
    noise = page[page.index('id="noise"'):page.index("</p>", page.index('id="noise"'))]
    assert "Within noise" in noise and "includes 0" in noise
    assert f"about {math.ceil(need / 7)} holdout images per class ({need} in all)" in noise
    assert "3-point difference" in noise
    listed = client.get("/ui/jobs").text
    row = listed[listed.index(f'data-job="{job_id}"'):]
    row = row[:row.index("</tr>")]
    assert "the base model, unchanged" in row and 'class="unadapted"' in row


def test_jobs_show_says_what_the_page_says(tmp_path: Path) -> None:
    """``t3ar jobs show`` said neither stale nor re-run, marked no withdrawn item, gave no accuracy before ->
    after, nor how many images were adapted on, and called a base-model winner "t3ar"."""
    pool = new_pool()
    with TestClient(app_for(settings_for(tmp_path), pool)) as c:
        csrf = signed_in(c, "admin-t")
        job_id = finished_job(c, tmp_path, csrf)
        _with_acceptance(tmp_path, job_id, ACCEPTANCE)
        pool["ids"] |= {"p-3", "p-4"}
        assert c.post("/ui/pool/p-2/withdraw", data={"csrf": csrf}).status_code == 200
    with serving(app_for(settings_for(tmp_path), pool)) as port:  # the same data dir, a real API
        url = f"http://127.0.0.1:{port}"
        run = CliRunner().invoke(jobs, ["show", job_id, "--url", url, "--token", "user-t"])
        assert run.exit_code == 0, run.output
        out = run.stdout
        assert f"returns {'the base model, unchanged'}" in out, out
        assert "STALE: 1 pool item(s) it retrieved were withdrawn since (p-2)" in out
        assert f"t3ar jobs readapt {job_id}" in out
        assert "accuracy 40.0% -> 60.0% on the target's labels" in out and "4 images (adapted on 4)" in out
        assert "p-1 (red, 3 steps), p-2 (" in out and ", 1 step, WITHDRAWN since)" in out  # p-2's label is hostile
        assert "Within noise" in out and "holdout images per class" in out
        again = CliRunner().invoke(jobs, ["readapt", job_id, "--url", url, "--token", "user-t"])
        assert again.exit_code == 0, again.output
        rerun = re.search(r"job (\w+) queued", again.stdout)
        assert rerun
        run = CliRunner().invoke(jobs, ["show", job_id, "--url", url, "--token", "user-t"])
        assert f"re-run as: {rerun.group(1)}" in run.stdout and "use its re-run below" in run.stdout


def test_stale_marks_everywhere_and_no_second_readapt(client: TestClient, tmp_path: Path,
                                                      pool: dict[str, Any]) -> None:
    """The ONNX and safetensors buttons, the jobs list and the labelled-neighbours table were unmarked, and
    "Readapt (current pool)" stayed offered after a re-run existed."""
    csrf = signed_in(client, "admin-t")
    job_id = finished_job(client, tmp_path, csrf)
    pool["ids"] |= {"p-3", "p-4"}
    fresh = client.get(f"/ui/jobs/{job_id}").text
    assert "(stale)" not in fresh and 'class="withdrawn"' not in fresh
    assert client.post("/ui/pool/p-2/withdraw", data={"csrf": csrf}).status_code == 200
    item = client.get("/ui/pool/p-2").text  # said "withdrawn, or never added" beside its withdrawal time
    said = item[item.index('id="withdrawn-at"'):item.index("</p>", item.index('id="withdrawn-at"'))]
    assert re.search(r"Withdrawn by an admin at 20\d\d-\d\d-\d\d \d\d:\d\d:\d\d UTC", said)
    assert "never added" not in item
    page = client.get(f"/ui/jobs/{job_id}").text
    for button in ("download-checkpoint", "download-onnx", "download-safetensors"):
        tag = page[page.index(f'id="{button}"'):]
        assert "(stale)" in tag[:tag.index("</a>")], button
    table = page[page.index('id="labelled-neighbours"'):page.index("</table>", page.index('id="labelled-neighbours"'))]
    marked = table[table.index('href="/ui/pool/p-2"'):]
    assert "(withdrawn: stale)" in marked[:marked.index("</tr>")]
    assert "withdrawn" not in table[table.index('href="/ui/pool/p-1"'):table.index("</tr>")]
    listed = client.get("/ui/jobs").text
    row = listed[listed.index(f'data-job="{job_id}"'):]
    assert 'class="stale"' in row[:row.index("</tr>")]
    assert 'id="readapt"' in page
    rerun = client.post(f"/ui/jobs/{job_id}/readapt", data={"csrf": csrf}, follow_redirects=False)
    assert rerun.status_code == 303
    page = client.get(f"/ui/jobs/{job_id}").text
    assert 'id="readapt"' not in page and 'id="reruns"' in page


def _job(status: str, **kw: Any) -> JobOut:
    return JobOut(id="j", url="u", status=status, model_id="m", created_at="t",  # type: ignore[arg-type]
                  config={"method": "t3ar", "epochs": 3}, target=TargetInfo(images=8, labelled=False, skipped=0),
                  contribution=Contribution(requested=False, status="not_requested"), **kw)


def test_progress_names_the_candidate_and_what_a_queued_job_waits_for() -> None:
    """Progress said "candidate" and epoch "- / 3", and a queued job said nothing of what it waits for."""
    running = _job("started", progress=Progress(phase="candidate", candidate="bn-adapt (2/3)"))
    assert progress_words(running) == "candidate bn-adapt (2/3), candidate"
    training = _job("started", progress=Progress(phase="adapting", candidate="t3ar (3/3)", epoch=2, epochs=3,
                                                 step=5, total_steps=12))
    assert progress_words(training) == "candidate t3ar (3/3), adapting, epoch 2 of 3, step 5 of 12"
    assert progress_words(_job("queued", queue_position=2)) == "waiting for a worker: 2 jobs ahead in the queue"
    assert "no worker is listening" in progress_words(_job("queued", queue_position=0), workers=0)
    assert progress_words(_job("finished")) == ""


def test_the_job_page_shows_where_a_queued_job_is(client: TestClient, tmp_path: Path) -> None:
    csrf = signed_in(client)
    job_id = finished_job(client, tmp_path, csrf)
    queued = client.post(f"/ui/jobs/{job_id}/readapt", data={"csrf": csrf}, follow_redirects=False)
    page = client.get(queued.headers["location"]).text
    where = page[page.index('id="job-where"'):page.index("</td>", page.index('id="job-where"'))]
    assert "waiting for a worker" in where and "no worker is listening" in where
    assert "waiting for a worker" in client.get("/ui/jobs").text


def test_images_to_resolve_sizes_a_holdout_whose_ci_is_three_points_wide() -> None:
    """The formula N = n (h / 3)^2 from the paired standard error: a holdout of N images drawn like this one gives
    a paired CI of half-width about 3 points."""
    rng = np.random.default_rng(0)
    n = 98
    a, b = rng.random(n) < 0.6, rng.random(n) < 0.55  # two candidates that disagree on about half the images
    d = paired_diff(a, b, seed=1)
    need = images_to_resolve(n, d.lo, d.hi)
    assert need is not None and need > n
    idx = rng.integers(0, n, need)  # a holdout of that size, drawn like this one
    big = paired_diff(a[idx], b[idx], seed=1)
    assert 2.4 < (big.hi - big.lo) / 2 < 3.6
    assert images_to_resolve(n, 0.0, 0.0) is None  # identical on every image: nothing to size from


def _error_parts(html: str) -> tuple[str, str, str]:
    """(headline, message, links) of an error page."""
    def part(tag_id: str) -> str:
        start = html.index(f'id="{tag_id}"')
        return html[start:html.index("</", html.index(">", start) + 1) if tag_id != "error-links" else
                    html.index("</p>", start)]
    return part("error-headline"), part("error-message"), part("error-links")


def test_error_pages_say_what_went_wrong_and_link_back_to_where_they_were(client: TestClient, tmp_path: Path,
                                                                          monkeypatch: Any) -> None:
    """Error pages were headed by a bare "422" or "403", the Models page's linked "Back to the jobs", and a
    checkpoint whose model could not be built read "KeyError: 'stem'"."""
    import io

    import torch
    from console_kit import model_file

    import t3ar.models.checkpoint as checkpoint

    csrf = signed_in(client)
    page = client.post("/ui/models", files={"file": ("m.pt", b"not a checkpoint")}, data={"csrf": csrf})
    headline, message, links = _error_parts(page.text)
    assert page.status_code == 422 and "Refused" in headline and "not a t3ar checkpoint" in message
    assert 'href="/ui/models">Back to the models' in links and "/ui/jobs" not in links
    assert "<title>422" not in page.text and "<h1>422" not in page.text
    denied = client.post("/ui/pool/p-1/withdraw", data={"csrf": csrf})
    headline, message, links = _error_parts(denied.text)
    assert denied.status_code == 403 and "Not allowed" in headline and "admin token" in message
    assert 'href="/ui/pool">Back to the pool' in links

    def no_stem(*args: Any, **kw: Any) -> Any:
        raise KeyError("stem")

    monkeypatch.setattr(checkpoint, "load_checkpoint", no_stem)
    good = model_file(tmp_path)
    assert torch.load(io.BytesIO(good), weights_only=False)["spec"]  # a real checkpoint; its build fails
    page = client.post("/ui/models", files={"file": ("m.pt", good)}, data={"csrf": csrf})
    _, message, _ = _error_parts(page.text)
    assert page.status_code == 422 and "KeyError" not in page.text and "cannot be built" in message
    assert "it names &#39;stem&#39;, which this build of t3ar does not know" in message
    api = client.post("/models", files={"file": ("m.pt", good)}, headers=USER).json()["error"]["message"]
    assert "KeyError" not in api and "'stem'" in api


def test_sign_in_says_why_a_token_does_not_open_the_console(client: TestClient) -> None:
    """A service token was answered "unknown token"; a revoked key landed on the sign-in page without a word."""
    from console_kit import csrf_of, sign_in

    for token, words in (("worker-t", "the workers' token (T3AR_API_WORKER_TOKEN)"),
                         ("r-admin", "the retriever's admin token (T3AR_RETRIEVER_ADMIN_TOKEN)")):
        page = sign_in(client, token)
        said = html.unescape(page.text)
        assert page.status_code == 401 and words in said and "never signs in to the console" in said
    assert "unknown token" in sign_in(client, "nonsense").text
    made = client.post("/keys", json={"team": "vision", "role": "submit", "name": "v"},
                       headers={"Authorization": "Bearer admin-t"}).json()
    assert sign_in(client, made["key"]).status_code == 303
    assert client.get("/ui/jobs").status_code == 200
    assert client.delete(f"/keys/{made['id']}", headers={"Authorization": "Bearer admin-t"}).status_code == 200
    landed = client.get("/ui/jobs")  # followed to the sign-in page
    assert landed.url.path == "/ui/login" and 'id="login-ended"' in landed.text
    assert "the API key it was signed in with has been revoked" in landed.text
    page = client.post("/ui/login", data={"csrf": csrf_of(landed.text), "token": made["key"], "next": "/ui/jobs"})
    assert page.status_code == 401 and "this API key was revoked (20" in page.text
    assert 'id="login-ended"' not in client.get("/ui/login?ended=%3Cscript%3E").text  # a fixed word, never echoed


def test_the_cli_says_which_token_it_needs_uses_and_what_to_do_next(tmp_path: Path) -> None:
    """`t3ar audit` with the user token said "missing bearer token"; `jobs show` of an unknown job pointed to
    `GET /jobs`; `t3ar withdraw` used the admin token from the environment silently and said nothing of
    re-adapting the jobs that used the item."""
    from t3ar.cli.job_cmd import withdraw
    from t3ar.cli.keys_cmd import audit

    pool = new_pool()
    with TestClient(app_for(settings_for(tmp_path), pool)) as c:
        job_id = finished_job(c, tmp_path, signed_in(c))
    with serving(app_for(settings_for(tmp_path), pool)) as port:
        url = f"http://127.0.0.1:{port}"
        user_env = {"T3AR_API_URL": url, "T3AR_API_TOKEN": "user-t", "T3AR_API_ADMIN_TOKEN": None}
        run = CliRunner(env=user_env).invoke(audit, [])
        assert run.exit_code == 2 and "`audit` needs an admin token: set T3AR_API_ADMIN_TOKEN" in run.output
        assert "user token cannot do this" in run.output and "missing bearer token" not in run.output
        run = CliRunner(env=user_env).invoke(jobs, ["show", "0" * 32])
        assert run.exit_code == 1 and "list them with `t3ar jobs list`" in run.output and "GET /" not in run.output
        admin_env = {**user_env, "T3AR_API_ADMIN_TOKEN": "admin-t"}
        run = CliRunner(env=admin_env).invoke(withdraw, ["p-1"])
        assert run.exit_code == 0, run.output
        assert "withdrawing with the admin token from T3AR_API_ADMIN_TOKEN" in run.stderr
        assert f"withdrew p-1: used by 1 finished job(s)\n  {job_id}" in run.stdout
        assert "Re-adapt them against the pool without it: `t3ar jobs readapt JOB_ID`" in run.stdout
        run = CliRunner(env=user_env).invoke(withdraw, ["p-2", "--token", "admin-t"])
        assert "withdrawing with the token given with --token" in run.stderr and pool["deleted"] == ["p-1", "p-2"]

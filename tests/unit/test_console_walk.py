"""What a new user meets in the console after a withdrawal and around it (in-process, TestClient): the original
job's page says its checkpoint is stale and links its re-run, the withdrawn item's page says what its re-runs are
doing, one click re-runs a bounded number of jobs, near-duplicates are only those above the pool's threshold, the
jobs list tells presets apart, a test-time target's labels are said to only score it, and error pages name console
pages rather than JSON routes."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from console_kit import app_for, finished_job, settings_for, signed_in
from console_kit import client as client  # the fixtures
from console_kit import pool as pool
from fastapi.testclient import TestClient
from rq.executions import Execution
from rq.job import JobStatus
from rq.registry import StartedJobRegistry

from t3ar_services.api.schemas import Contribution, JobOut, TargetInfo

USER = {"Authorization": "Bearer user-t"}


def _start(client: TestClient, job_id: str) -> None:
    """Mark a queued job running, the way a worker's rq does."""
    jobs = client.app.state.api.jobs  # type: ignore[attr-defined]
    rq_job = jobs.fetch(job_id)
    rq_job.started_at = dt.datetime.now(dt.UTC)
    rq_job.save()
    with jobs.queue.connection.pipeline() as pipe:
        rq_job.set_status(JobStatus.STARTED, pipeline=pipe)
        Execution.create(rq_job, ttl=600, pipeline=pipe)
        pipe.execute()
    assert job_id in StartedJobRegistry(queue=jobs.queue).get_job_ids(cleanup=False)


def _readapted(client: TestClient, csrf: str, pool_id: str) -> tuple[list[str], str]:
    posted = client.post(f"/ui/pool/{pool_id}/readapt", data={"csrf": csrf}, follow_redirects=False)
    assert posted.status_code == 303, posted.text
    page = client.get(posted.headers["location"]).text
    return re.findall(r'<li><a href="/ui/jobs/([0-9a-f]{32})"', page), page


def test_after_a_withdrawal_the_original_job_says_stale_and_links_its_rerun(client: TestClient, tmp_path: Path,
                                                                          pool: dict[str, Any]) -> None:
    """The original job's page said nothing (no "used a withdrawn item", no link to its re-run), and the withdrawn
    item's page called the running re-run "running now (they may have retrieved it already)"."""
    csrf = signed_in(client, "admin-t")
    job_id = finished_job(client, tmp_path, csrf)
    pool["ids"] |= {"p-3", "p-4"}
    fresh = client.get(f"/ui/jobs/{job_id}").text
    assert 'id="stale"' not in fresh and 'id="reruns"' not in fresh
    assert client.get(f"/jobs/{job_id}", headers=USER).json()["used_withdrawn"] == 0
    assert client.post("/ui/pool/p-2/withdraw", data={"csrf": csrf}).status_code == 200
    page = client.get(f"/ui/jobs/{job_id}").text
    assert 'id="stale"' in page and "withdrawn since" in page and 'href="/ui/pool/p-2"' in page
    assert "Readapt it to get a checkpoint that never saw them" in page and "(.pt) (stale)" in page
    new_ids, _ = _readapted(client, csrf, "p-2")
    assert len(new_ids) == 1
    new_id = new_ids[0]
    page = client.get(f"/ui/jobs/{job_id}").text
    reruns = page[page.index('id="reruns"'):]
    assert f'href="/ui/jobs/{new_id}"' in reruns and ">queued<" in reruns and "Use the re-run below" in page
    body = client.get(f"/jobs/{job_id}", headers=USER).json()
    assert body["used_withdrawn"] == 1 and body["superseded_by"] == [new_id]
    assert client.get("/jobs", headers=USER).json()["jobs"][0]["superseded_by"] is None  # lists leave it out
    _start(client, new_id)
    item = client.get("/ui/pool/p-2").text
    assert "may have retrieved" not in item and "may retrieve" not in item
    table = item[item.index('id="reruns"'):item.index("</table>", item.index('id="reruns"'))]
    assert f'href="/ui/jobs/{new_id}"' in table and ">running<" in table and f'href="/ui/jobs/{job_id}"' in table
    assert "retrieve from the pool without it" in item


def test_a_job_running_since_before_the_withdrawal_may_have_used_it(client: TestClient, tmp_path: Path,
                                                                    pool: dict[str, Any]) -> None:
    csrf = signed_in(client, "admin-t")
    job_id = finished_job(client, tmp_path, csrf)
    pool["ids"] |= {"p-3", "p-4"}
    other = client.post(f"/ui/jobs/{job_id}/readapt", data={"csrf": csrf}, follow_redirects=False)
    other_id = other.headers["location"].rsplit("/", 1)[1]
    _start(client, other_id)  # running before the withdrawal
    assert client.post("/ui/pool/p-2/withdraw", data={"csrf": csrf}).status_code == 200
    item = client.get("/ui/pool/p-2").text
    found = item[item.index('id="may-have-used"'):]
    assert f'href="/ui/jobs/{other_id}"' in found.split("</p>")[0]
    assert 'id="reruns"' not in item  # made before the withdrawal: not one of its re-runs


@pytest.fixture()
def capped(tmp_path: Path, pool: dict[str, Any]) -> Iterator[TestClient]:
    with TestClient(app_for(settings_for(tmp_path, console_max_readapts=1), pool)) as c:
        yield c


def test_one_click_readapts_at_most_the_cap_and_says_how_many_are_left(capped: TestClient, tmp_path: Path,
                                                                       pool: dict[str, Any]) -> None:
    """One console click re-adapted every job that used the item, with no cap."""
    csrf = signed_in(capped, "admin-t")
    first = finished_job(capped, tmp_path, csrf)
    second = finished_job(capped, tmp_path, csrf)
    pool["ids"] |= {"p-3", "p-4"}
    done = capped.post("/ui/pool/p-2/withdraw", data={"csrf": csrf}).text
    assert "Readapt 1 of the 2 affected jobs not yet re-run" in done and "T3AR_API_CONSOLE_MAX_READAPTS" in done
    started, page = _readapted(capped, csrf, "p-2")
    assert len(started) == 1 and 'id="readapt-left"' in page and "<b>1</b> affected job(s) left" in page
    assert 'id="readapt-more"' in page
    again, page = _readapted(capped, csrf, "p-2")  # the next click goes on with the rest
    assert len(again) == 1 and again != started and 'id="readapt-left"' not in page
    parents = {capped.get(f"/jobs/{j}", headers=USER).json()["parent_id"] for j in started + again}
    assert parents == {first, second}
    assert 'id="all-rerun"' in capped.get("/ui/pool/p-2/withdrawn").text
    none, _ = _readapted(capped, csrf, "p-2")
    assert none == []  # nothing re-run twice


def test_near_duplicates_are_only_those_above_the_pools_threshold(client: TestClient, pool: dict[str, Any]) -> None:
    """"Near-duplicates" listed plain nearest neighbours at any similarity."""
    signed_in(client)
    page = client.get("/ui/pool/p-1").text  # the mock scores 0.9; the pool's threshold is 0.98
    assert 'id="no-near"' in page and 'id="nearest"' in page and "Nearest neighbours" in page
    assert 'href="/ui/pool/p-2"' in page[page.index('id="nearest"'):]
    pool["threshold"] = 0.85
    page = client.get("/ui/pool/p-1").text
    assert 'id="near"' in page and 'id="nearest"' not in page and "0.85 or more" in page


def _job(config: dict[str, Any], labelled: bool) -> JobOut:
    return JobOut(id="j", url="u", status="finished", model_id="m", created_at="t", config=config,
                  target=TargetInfo(images=64, labelled=labelled, skipped=0),
                  contribution=Contribution(requested=False, status="not_requested"))


def test_the_list_tells_presets_apart_and_a_test_time_targets_labels_only_score_it(client: TestClient,
                                                                                  tmp_path: Path) -> None:
    """Both presets read "t3ar"; a test-time job on a labelled target read "64 images, labelled"."""
    from t3ar_services.api.console.pages_jobs import method_name, target_words
    from t3ar_services.api.schemas import job_config

    assert method_name(job_config({"method": "t3ar", "preset": "paper"})) == "t3ar · paper"
    assert method_name(job_config({"method": "t3ar", "preset": "validated"})) == "t3ar · validated"
    assert method_name(job_config({"method": "bn-adapt"})) == "bn-adapt"
    test_time = target_words(_job({"method": "t3ar", "mode": "test"}, True))
    assert test_time.startswith("64 images, labelled (only to score it") and "never sees the labels" in test_time
    assert target_words(_job({"method": "t3ar", "mode": "train"}, True)) == "64 images, labelled (trained on)"
    assert target_words(_job({"method": "t3ar", "mode": "test"}, False)) == "64 images"
    csrf = signed_in(client)
    job_id = finished_job(client, tmp_path, csrf)
    row = client.get("/ui/jobs").text
    assert "<td>t3ar · validated</td>" in row  # the services give a T3AR job the default preset
    assert "t3ar · validated" in client.get(f"/ui/jobs/{job_id}").text


def test_error_pages_name_console_pages_not_json_routes(client: TestClient) -> None:
    csrf = signed_in(client, "admin-t")
    cases = {"/ui/jobs/" + "0" * 32: '<a href="/ui/jobs">The jobs</a>',
             "/ui/keys/nokey/revoke": '<a href="/ui/keys">The API keys</a>',
             "/ui/pool/zzz/withdraw": '<a href="/ui/pool/zzz">The pool item&#39;s page</a>'}
    for path, link in cases.items():
        page = client.post(path, data={"csrf": csrf}) if path.endswith(("revoke", "withdraw")) else client.get(path)
        if path.endswith("withdraw"):  # POST for an item the pool does not hold: the retriever's 404
            assert page.status_code == 404, page.text
        assert page.status_code == 404 and "GET /" not in page.text and "POST /" not in page.text, page.text
        assert link in page.text, (path, page.text[-1500:])
        # the navigation's, and on a job's page one back to the jobs; other pages link back to their own section
        assert page.text.count('href="/ui/jobs">') == (2 if path.startswith("/ui/jobs") else 1)
        assert 'id="error-headline">Not found' in page.text


def test_the_tokens_have_one_name_in_t3ar_up_the_sign_in_page_and_the_docs(client: TestClient, tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """`t3ar up` printed "api token" and "api admin token"; the sign-in page said "user token" and "admin
    token"."""
    from t3ar_services.cli.stack import _announce

    tokens = {"api_token": "U" * 8, "api_admin_token": "A" * 8, "retriever_token": "R" * 8,
              "retriever_admin_token": "RA", "api_worker_token": "W"}
    _announce(tmp_path, {"data_dir": str(tmp_path), "console_url": "http://c/ui", "api_url": "http://a",
                         "retriever_url": "http://r", "redis_url": "redis://x", "tokens": tokens}, [])
    printed = capsys.readouterr().out
    login = client.get("/ui/login").text
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    console_doc = (Path(__file__).parents[2] / "docs" / "console.md").read_text()
    for name, env, value in (("user token", "T3AR_API_TOKEN", "U" * 8),
                             ("admin token", "T3AR_API_ADMIN_TOKEN", "A" * 8)):
        assert re.search(rf"^  {name} +{value} +\({env};", printed, re.M), printed
        assert f"<b>{name}</b> (<code>{env}</code>)" in re.sub(r"\s+", " ", login)
        assert f"*{name}* (`{env}`)" in re.sub(r"\s+", " ", readme)
        assert f"| {name} (`{env}`)" in console_doc
    assert "api token" not in printed.lower() and "api admin token" not in readme.lower()

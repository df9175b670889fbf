"""The console's pages in-process (TestClient): scopes (a user cannot withdraw), withdrawal and readapt, hostile
strings rendered as text on every page that shows them, charts, neighbours and lineage, and no 5xx. In a real
browser: tests/e2e/test_console_browser.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from console_kit import (
    HOSTILE,
    JS_URL,
    finished_job,
    png_image,
    signed_in,
)
from console_kit import client as client  # the fixtures
from console_kit import pool as pool
from fastapi.testclient import TestClient
from rq.job import JobStatus

from t3ar_services.common.job_contract import LINEAGE_FILE, REPORT_FILE, artifacts_dir, write_json_atomic


def test_a_user_session_cannot_withdraw(client: TestClient, pool: dict[str, Any]) -> None:
    csrf = signed_in(client, "user-t")
    assert 'id="withdraw"' not in client.get("/ui/pool/p-1").text
    assert client.get("/ui/pool/p-1/withdraw").status_code == 403
    resp = client.post("/ui/pool/p-1/withdraw", data={"csrf": csrf})
    assert resp.status_code == 403 and "admin token" in resp.text and pool["deleted"] == []


def test_an_admin_withdraws_after_confirming_and_is_offered_readapt(client: TestClient, pool: dict[str, Any],
                                                                    tmp_path: Path) -> None:
    csrf = signed_in(client, "admin-t")
    data = tmp_path / "data"
    job_id = "j" * 32
    art = artifacts_dir(data, job_id)
    art.mkdir(parents=True)
    write_json_atomic(art / LINEAGE_FILE, {"pool_ids": ["p-1"], "created_at": "2026-01-01T00:00:00+00:00",
                                          "checkpoint_sha256": "0" * 64})
    assert 'id="withdraw"' in client.get("/ui/pool/p-1").text
    confirm = client.get("/ui/pool/p-1/withdraw")
    assert confirm.status_code == 200 and job_id[:12] in confirm.text and pool["deleted"] == []
    posted = client.post("/ui/pool/p-1/withdraw", data={"csrf": csrf}, follow_redirects=False)
    assert posted.status_code == 303 and posted.headers["location"] == "/ui/pool/p-1/withdrawn"  # reload-safe
    assert pool["deleted"] == ["p-1"]
    done = client.get("/ui/pool/p-1/withdrawn")
    assert done.status_code == 200
    assert 'id="readapt-affected"' in done.text and job_id[:12] in done.text
    gone = client.get("/ui/pool/p-1")
    assert gone.status_code == 200 and "withdrawn" in gone.text and job_id[:12] in gone.text  # lineage stays


def test_hostile_strings_render_as_text_on_every_page(client: TestClient, tmp_path: Path) -> None:
    csrf = signed_in(client, "admin-t")
    job_id = finished_job(client, tmp_path, csrf)
    pages = {p: client.get(p) for p in ("/ui/pool", f"/ui/pool?source={HOSTILE}", "/ui/pool/p-1",
                                        "/ui/pool/p-1/withdraw", "/ui/models", f"/ui/jobs/{job_id}", "/ui/jobs",
                                        f"/ui/pool/{HOSTILE}")}
    search = client.post("/ui/pool/search", files={"image": (f"{HOSTILE}.png", png_image(3))}, data={"csrf": csrf})
    pages["search"] = search
    failed = client.post(f"/ui/jobs/{job_id}/readapt", data={"csrf": csrf}, follow_redirects=False)
    failed_id = failed.headers["location"].rsplit("/", 1)[1]
    rq_job = client.app.state.api.jobs.fetch(failed_id)  # type: ignore[attr-defined]
    rq_job.meta["error"] = f"{HOSTILE} {JS_URL}"  # what a worker writes when a job fails
    rq_job.save_meta()
    rq_job.set_status(JobStatus.FAILED)
    pages["failed job"] = client.get(f"/ui/jobs/{failed_id}")
    shown = {"/ui/pool", f"/ui/pool?source={HOSTILE}", "/ui/pool/p-1", "/ui/pool/p-1/withdraw", "/ui/models",
             "search", "failed job"}
    for path, resp in pages.items():
        assert resp.status_code < 500, path
        assert "<script>alert" not in resp.text and "<img src=x" not in resp.text, path
        assert 'href="javascript:' not in resp.text and 'src="javascript:' not in resp.text, path
        if path in shown:
            assert "&lt;script&gt;alert(1)&lt;/script&gt;" in resp.text, path
    assert JS_URL in pages["/ui/pool/p-1"].text  # shown as text, never as a link


def test_job_page_shows_charts_neighbours_and_lineage(client: TestClient, tmp_path: Path) -> None:
    csrf = signed_in(client)
    job_id = finished_job(client, tmp_path, csrf)
    page = client.get(f"/ui/jobs/{job_id}")
    assert page.status_code == 200
    assert page.text.count("<polyline") == 4 and "accuracy on the target" in page.text and "60.0 %" in page.text
    assert f"/ui/jobs/{job_id}/target/imgs/a0.png" in page.text and "0.910" in page.text
    assert page.text.count('/ui/pool/p-1/image') >= 2  # neighbour and lineage thumbnails
    gone = client.get("/ui/pool/withdrawn-id/image")  # a withdrawn item's lineage thumbnail: a placeholder picture
    assert gone.status_code == 404 and gone.headers["content-type"] == "image/png"
    thumb = client.get(f"/ui/jobs/{job_id}/target/imgs/a0.png")
    assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/png"
    assert client.get(f"/ui/jobs/{job_id}/target/../../../api.sqlite3").status_code == 404
    assert client.get(f"/ui/jobs/{job_id}/target/%2e%2e/%2e%2e/api.sqlite3").status_code == 404
    ck = client.get(f"/ui/jobs/{job_id}/checkpoint")
    assert ck.status_code == 200 and ck.content == (tmp_path / "m.pt").read_bytes()
    rep = client.get(f"/ui/jobs/{job_id}/report")
    assert rep.status_code == 200 and "attachment" in rep.headers["content-disposition"]
    (tmp_path / "data" / "artifacts" / job_id / REPORT_FILE).unlink()  # lost: the page shows the rest
    page = client.get(f"/ui/jobs/{job_id}")
    assert page.status_code == 200 and 'id="lineage"' in page.text and "<polyline" not in page.text
    assert client.get(f"/ui/jobs/{job_id}/report").status_code == 404


def test_after_a_withdrawal_the_affected_jobs_are_readapted_from_the_console(client: TestClient, tmp_path: Path,
                                                                            pool: dict[str, Any]) -> None:
    csrf = signed_in(client, "admin-t")
    job_id = finished_job(client, tmp_path, csrf)
    pool["ids"] |= {"p-3", "p-4"}  # k=2 neighbours need 2 items left after the withdrawal
    done = client.post("/ui/pool/p-2/withdraw", data={"csrf": csrf})
    assert done.status_code == 200 and pool["deleted"] == ["p-2"] and job_id[:12] in done.text
    posted = client.post("/ui/pool/p-2/readapt", data={"csrf": csrf}, follow_redirects=False)
    assert posted.status_code == 303 and posted.headers["location"].startswith("/ui/pool/p-2/readapted?jobs=")
    resp = client.get(posted.headers["location"])
    assert resp.status_code == 200 and job_id[:12] in resp.text
    new_ids = re.findall(r'<li><a href="/ui/jobs/([0-9a-f]{32})"', resp.text)
    assert len(new_ids) == 1 and new_ids[0] != job_id
    new = client.get(f"/jobs/{new_ids[0]}", headers={"Authorization": "Bearer user-t"}).json()
    assert new["parent_id"] == job_id and new["status"] == "queued"  # through POST /jobs/{id}/readapt's code


def test_the_pool_grid_filters_by_source_including_no_source(client: TestClient, pool: dict[str, Any]) -> None:
    signed_in(client)
    count = lambda resp: resp.text.count('<li><a href="/ui/pool/')  # noqa: E731
    assert count(client.get("/ui/pool")) == count(client.get("/ui/pool?source=")) == 2  # all sources
    assert count(client.get("/ui/pool", params={"source": HOSTILE, "exact": "true"})) == 2
    none = client.get("/ui/pool?source=&exact=true")
    assert count(none) == 0 and "from no source" in none.text
    assert [p.get("source") for p in pool["listed"]] == [None, None, HOSTILE, ""]


def test_the_pool_grid_shows_and_filters_by_label(client: TestClient, pool: dict[str, Any]) -> None:
    """Issue 33: each item's class label is shown, the labels are offered as a filter, ``?label=`` is passed to
    the retriever's listing (and kept by the next-page link), and an item's page names its label."""
    signed_in(client)
    page = client.get("/ui/pool")
    assert page.status_code == 200 and 'id="label-filter"' in page.text and '<option value="red"' in page.text
    assert 'class="caption label" title="class label">red<' in page.text
    only = client.get("/ui/pool", params={"label": "red"})
    assert only.text.count('<li><a href="/ui/pool/') == 1 and 'labelled “red”' in only.text
    assert pool["listed"][-1].get("label") == "red" and pool["listed"][0].get("label") is None
    item = client.get("/ui/pool/p-1")
    assert item.status_code == 200 and 'id="item-label"><a href="/ui/pool?label=red">red</a>' in item.text
    assert "0.900 · red" in item.text  # its near-duplicates' labels too


def test_the_job_page_lists_the_labelled_neighbours(client: TestClient, tmp_path: Path) -> None:
    csrf = signed_in(client)
    job_id = finished_job(client, tmp_path, csrf)
    page = client.get(f"/ui/jobs/{job_id}")
    assert page.status_code == 200 and "Labelled neighbours as data (2)" in page.text
    table = page.text[page.text.index('id="labelled-neighbours"'):]
    assert '<a href="/ui/pool/p-1">p-1</a></td><td>red</td><td>3</td>' in table
    assert HOSTILE not in page.text  # escaped
    report = client.get(f"/jobs/{job_id}/report", headers={"Authorization": "Bearer user-t"}).json()
    assert report["labelled_neighbours"][0] == {"pool_id": "p-1", "label": "red", "uses": 3}


def test_a_search_image_is_bounded(client: TestClient) -> None:
    from t3ar_services.api.console.pages_pool import MAX_QUERY_BYTES

    csrf = signed_in(client)
    resp = client.post("/ui/pool/search", files={"image": ("big.png", b"x" * (MAX_QUERY_BYTES + 1))},
                       data={"csrf": csrf})
    assert resp.status_code == 413 and "at most 16 MiB" in resp.text


def test_no_console_page_answers_5xx(client: TestClient, tmp_path: Path) -> None:
    csrf = signed_in(client, "admin-t")
    job_id = finished_job(client, tmp_path, csrf)
    paths = ["/ui", "/ui/login", "/ui/jobs", "/ui/jobs?before=nope", f"/ui/jobs/{job_id}", "/ui/jobs/nope",
             f"/ui/jobs/{job_id}/report", f"/ui/jobs/{job_id}/checkpoint", "/ui/jobs/nope/checkpoint",
             "/ui/jobs/nope/target/x.png", "/ui/pool", "/ui/pool?after=zzz&source=nope", "/ui/pool/p-1",
             "/ui/pool/p-1/image", "/ui/pool/nope", "/ui/pool/nope/image", "/ui/pool/nope/withdraw",
             "/ui/pool/search", "/ui/models", "/ui/nope"]
    for path in paths:
        assert client.get(path).status_code < 500, path
    for path, files in (("/ui/pool/search", {"image": ("x.png", b"not an image")}),
                        ("/ui/models", {"file": ("x.pt", b"not a checkpoint")})):
        assert client.post(path, files=files, data={"csrf": csrf}).status_code < 500, path
    assert client.post("/ui/jobs/nope/cancel", data={"csrf": csrf}).status_code == 404
    ended = client.post(f"/ui/jobs/{job_id}/cancel", data={"csrf": csrf})
    assert ended.status_code == 409 and "already finished" in ended.text


def test_cancel_and_readapt_from_the_job_page(client: TestClient, tmp_path: Path) -> None:
    csrf = signed_in(client)
    job_id = finished_job(client, tmp_path, csrf)
    resp = client.post(f"/ui/jobs/{job_id}/readapt", data={"csrf": csrf}, follow_redirects=False)
    assert resp.status_code == 303
    new = resp.headers["location"].rsplit("/", 1)[1]
    page = client.get(f"/ui/jobs/{new}")
    assert "queued" in page.text and "Readapt of" in page.text and 'http-equiv="refresh"' in page.text
    assert 'id="cancel"' in page.text
    client.post(f"/ui/jobs/{new}/cancel", data={"csrf": csrf})
    assert 'id="job-status">canceled<' in client.get(f"/ui/jobs/{new}").text


def test_job_page_shows_the_phase_table(client: TestClient, tmp_path: Path) -> None:
    from t3ar_services.worker.phases import build_phases

    csrf = signed_in(client)
    job_id = finished_job(client, tmp_path, csrf)
    assert 'id="phases"' not in client.get(f"/ui/jobs/{job_id}").text  # a report from before phases: no table
    path = tmp_path / "data" / "artifacts" / job_id / REPORT_FILE
    report = __import__("json").loads(path.read_text())
    report["phases"] = build_phases({"steps": 6.0, "inputs_fetched": 1.5}, 10.0, queue_wait=0.25)
    write_json_atomic(path, report)
    page = client.get(f"/ui/jobs/{job_id}").text
    table = page[page.index('id="phases"'):page.index("</table>", page.index('id="phases"'))]
    assert "queue wait</th><td>0.25 s</td>" in table  # before the worker's total: no share
    assert "steps</th><td>6.00 s (60 %)" in table and "inputs fetched</th><td>1.50 s (15 %)" in table
    assert "other</th><td>2.50 s (25 %)" in table


def test_a_made_up_pool_id_is_not_found_and_a_withdrawn_one_says_withdrawn(client: TestClient,
                                                                           pool: dict[str, Any]) -> None:
    """An id the pool never held was shown as "Pool item zzz withdrawn"; now a 404 page saying it is unknown. An
    item withdrawn through the API (no job used it) still reads as withdrawn."""
    csrf = signed_in(client, "admin-t")
    for path in ("/ui/pool/zzz", "/ui/pool/zzz/withdrawn"):
        page = client.get(path)
        assert page.status_code == 404, path
        assert "no pool item" in page.text and "never withdrawn" in page.text
        assert 'class="status failed">withdrawn' not in page.text
    posted = client.post("/ui/pool/p-2/withdraw", data={"csrf": csrf}, follow_redirects=False)
    assert posted.status_code == 303 and pool["deleted"] == ["p-2"]
    for path in ("/ui/pool/p-2", "/ui/pool/p-2/withdrawn"):
        page = client.get(path)
        assert page.status_code == 200 and "withdrawn" in page.text, path
    assert 'class="status failed">withdrawn' in client.get("/ui/pool/p-2").text


def test_the_api_root_sends_a_browser_to_the_console(client: TestClient) -> None:
    """``/`` was a JSON 404 (and `t3ar up` prints the API's address)."""
    root = client.get("/", follow_redirects=False)
    assert root.status_code == 303 and root.headers["location"] == "/ui"
    page = client.get("/")  # followed: the console's sign-in page
    assert page.status_code == 200 and "/ui/login" in str(page.url)
    assert "/" not in client.get("/openapi.json").json()["paths"]


def test_job_page_shows_the_mlflow_registration(client: TestClient, tmp_path: Path) -> None:
    """Issue 51: the job page says whether its registration is pending (the last error), done (with links) or
    failed; nothing when the API registers none."""
    csrf = signed_in(client)
    job_id = finished_job(client, tmp_path, csrf)
    assert 'id="registration"' not in client.get(f"/ui/jobs/{job_id}").text  # registration off
    registrar = client.app.state.api.registrar  # type: ignore[attr-defined]
    registrar.settings.tracking_uri = "http://mlflow.example:5000"
    registrar.records.request(job_id, "default.cats", "challenger")
    registrar.records.failed_attempt(job_id, "ConnectionError: refused", 4102444800.0)
    page = client.get(f"/ui/jobs/{job_id}").text
    assert 'id="registration"' in page and "attempt 1 failed (ConnectionError: refused)" in page
    registrar.records.done(job_id, "3", "run9", "2")
    page = client.get(f"/ui/jobs/{job_id}").text
    assert "models:/default.cats/2" in page and "alias <code>challenger</code>" in page
    assert 'href="http://mlflow.example:5000/#/models/default.cats/versions/2"' in page
    assert 'href="http://mlflow.example:5000/#/experiments/3/runs/run9"' in page

"""The console's actions: submitting a job (``/ui/submit``, through ``jobs.submit`` as ``POST /adapt``) and adding
images to the pool (``/ui/pool/ingest``, through the API's read/write retriever client), with their refusals:
the read role, CSRF, unknown fields, a bad archive (the form again, with the reason, nothing left behind), and
the audit records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from console_kit import app_for, model_file, png_image, settings_for, signed_in, target_zip
from console_kit import client as client  # the fixtures
from console_kit import pool as pool
from fastapi.testclient import TestClient

from t3ar_services.api.console.pages_submit import config_of


def _model(client: TestClient, tmp_path: Path) -> str:
    resp = client.post("/models", files={"file": ("m.pt", model_file(tmp_path))}, data={"name": "tiny"},
                       headers={"Authorization": "Bearer user-t"})
    assert resp.status_code in (200, 201), resp.text
    return str(resp.json()["id"])


def _read_key(client: TestClient) -> str:
    resp = client.post("/keys", json={"team": "default", "role": "read", "name": "reader"},
                       headers={"Authorization": "Bearer admin-t"})
    assert resp.status_code == 201, resp.text
    return str(resp.json()["key"])


def _audit(client: TestClient, action: str) -> list[dict[str, Any]]:
    resp = client.get("/audit", params={"action": action}, headers={"Authorization": "Bearer admin-t"})
    assert resp.status_code == 200, resp.text
    return list(resp.json()["entries"])


def _job_dirs(tmp_path: Path) -> list[Path]:
    jobs = tmp_path / "data" / "jobs"
    return sorted(jobs.iterdir()) if jobs.is_dir() else []


def test_a_job_submitted_from_the_form_is_enqueued_owned_audited_and_shown(client: TestClient,
                                                                           tmp_path: Path) -> None:
    csrf = signed_in(client)
    model_id = _model(client, tmp_path)
    assert 'href="/ui/submit"' in client.get("/ui/jobs").text
    form = client.get("/ui/submit")
    assert form.status_code == 200 and model_id in form.text and "<option selected>t3ar</option>" in form.text
    resp = client.post("/ui/submit", files={"archive": ("t.zip", target_zip()), "holdout": ("", b"")},
                       data={"csrf": csrf, "model_id": model_id, "method": "tent", "preset": "", "fraction": "0.5",
                             "epochs": "2", "contribute": "on", "candidates": "", "winner_rule": ""},
                       follow_redirects=False)
    assert resp.status_code == 303, resp.text
    job_id = resp.headers["location"].removeprefix("/ui/jobs/")
    job = client.get(f"/jobs/{job_id}", headers={"Authorization": "Bearer user-t"}).json()
    assert job["config"]["method"] == "tent" and job["config"]["fraction"] == 0.5 and job["config"]["epochs"] == 2
    assert job["target"]["images"] == 4
    assert client.get(resp.headers["location"]).status_code == 200
    entry = _audit(client, "job.submit")[0]
    assert entry["target"] == job_id and entry["team"] == "default" and entry["detail"] == f"model={model_id}"


def _labelled_zip() -> bytes:
    """The four images of :func:`target_zip` with a labels.csv naming the model's classes."""
    import io
    import zipfile

    buf = io.BytesIO(target_zip())
    with zipfile.ZipFile(buf, "a") as zf:
        zf.writestr("labels.csv", "path,label\n" + "".join(f"imgs/{'ab'[i % 2]}{i}.png,{'ab'[i % 2]}\n"
                                                           for i in range(4)))
    return buf.getvalue()


def test_the_form_runs_a_labelled_target_in_test_mode(client: TestClient, tmp_path: Path) -> None:
    """The form had no mode field: a labelled target always ran train-time (issue 50)."""
    csrf = signed_in(client)
    model_id = _model(client, tmp_path)
    form = client.get("/ui/submit").text
    assert 'name="mode"' in form and '<option value="test"' in form
    jobs = {}
    for mode in ("test", ""):
        resp = client.post("/ui/submit", files={"archive": ("t.zip", _labelled_zip())},
                           data={"csrf": csrf, "model_id": model_id, "method": "tent", "mode": mode},
                           follow_redirects=False)
        assert resp.status_code == 303, resp.text
        jobs[mode] = resp.headers["location"].removeprefix("/ui/jobs/")
    job = client.get(f"/jobs/{jobs['test']}", headers={"Authorization": "Bearer user-t"}).json()
    assert job["config"]["mode"] == "test" and job["target"]["labelled"]
    assert "only to score it" in client.get(f"/ui/jobs/{jobs['test']}").text
    job = client.get(f"/jobs/{jobs['']}", headers={"Authorization": "Bearer user-t"}).json()
    assert job["config"]["mode"] == "train"  # left empty: the target decides, as before
    resp = client.post("/ui/submit", files={"archive": ("t.zip", _labelled_zip())},
                       data={"csrf": csrf, "model_id": model_id, "method": "tent", "mode": "sideways"})
    assert resp.status_code == 422 and "mode must be test or train" in resp.text


def test_a_bad_archive_shows_the_form_again_with_the_reason_and_leaves_nothing(client: TestClient,
                                                                               tmp_path: Path) -> None:
    csrf = signed_in(client)
    model_id = _model(client, tmp_path)
    resp = client.post("/ui/submit", files={"archive": ("t.zip", b"not a zip at all")},
                       data={"csrf": csrf, "model_id": model_id, "method": "tent", "epochs": "3"})
    assert resp.status_code == 422, resp.text
    assert 'id="submit-error"' in resp.text and 'id="submit-form"' in resp.text
    assert 'value="3"' in resp.text  # what was typed stays
    assert _job_dirs(tmp_path) == [] and [e["outcome"] for e in _audit(client, "job.submit")] == ["refused"]
    assert client.get("/jobs", headers={"Authorization": "Bearer user-t"}).json()["jobs"] == []
    # options the domain layer refuses come back the same way: an unknown method, a bad number, a stray field
    for data, words in (({"method": "nope"}, "nope"), ({"method": "source", "epochs": "two"}, "whole number"),
                        ({"method": "source", "confg": "{}"}, "confg"),
                        ({"method": "source", "epochs": "3"}, "not of source")):  # source has no schedule
        resp = client.post("/ui/submit", files={"archive": ("t.zip", target_zip())},
                           data={"csrf": csrf, "model_id": model_id, **data})
        assert resp.status_code == 422 and 'id="submit-error"' in resp.text and words in resp.text, resp.text
    assert _job_dirs(tmp_path) == []


def test_refused_withdrawals_uploads_and_submits_are_in_the_audit_log(client: TestClient, tmp_path: Path,
                                                                       pool: dict[str, Any]) -> None:
    """The audit log recorded only refused sign-ins (issue 50): a withdrawal refused 403, an upload or a submit
    refused 422 left no trace; the action filter had no pool.ingest."""
    user = {"Authorization": "Bearer user-t"}
    assert client.delete("/pool/p-1", headers=user).status_code == 403
    assert client.post("/models", files={"file": ("m.pt", b"not a checkpoint")}, headers=user).status_code == 422
    model_id = _model(client, tmp_path)
    sent = client.post("/adapt", files={"archive": ("t.zip", b"not a zip")}, data={"model_id": model_id},
                       headers=user)
    assert sent.status_code == 422
    csrf = signed_in(client)  # the console: a user (submit) session
    assert client.post("/ui/pool/p-2/withdraw", data={"csrf": csrf}).status_code == 403
    assert client.post("/ui/models", files={"file": ("m.pt", b"nope")}, data={"csrf": csrf}).status_code == 422
    assert client.post("/ui/submit", files={"archive": ("t.zip", b"not a zip")},
                       data={"csrf": csrf, "model_id": model_id}).status_code == 422
    assert client.post("/ui/pool/ingest", data={"csrf": csrf, "source": ""},
                       files={"files": ("a.png", png_image(1))}).status_code == 422
    assert pool["deleted"] == [] and _job_dirs(tmp_path) == []
    every = client.get("/audit", headers={"Authorization": "Bearer admin-t"}).json()["entries"]
    got = {(e["action"], e["target"], e["detail"][:4]) for e in every if e["outcome"] == "refused"}
    assert {("pool.withdraw", "p-1", "403:"), ("pool.withdraw", "p-2", "403:"), ("model.upload", "", "422:"),
            ("job.submit", "", "422:"), ("pool.ingest", "", "422:")} <= got, got
    assert [e["outcome"] for e in _audit(client, "model.upload")] == ["refused", "ok", "refused"]
    assert [e["outcome"] for e in _audit(client, "job.submit")] == ["refused", "refused"]  # the form's, the API's
    client.cookies.clear()
    signed_in(client, "admin-t")
    assert '<option value="pool.ingest"' in client.get("/ui/audit").text


def test_a_read_key_cannot_submit_or_ingest_and_csrf_is_required(client: TestClient, tmp_path: Path,
                                                                  pool: dict[str, Any]) -> None:
    csrf = signed_in(client)
    model_id = _model(client, tmp_path)
    for path in ("/ui/submit", "/ui/pool/ingest"):  # a POST without the CSRF token does nothing
        resp = client.post(path, files={"archive": ("t.zip", target_zip()), "files": ("a.png", png_image(1))},
                           data={"model_id": model_id, "source": "s"})
        assert resp.status_code == 403 and "CSRF" in resp.text, resp.text
    assert _job_dirs(tmp_path) == [] and "added" not in pool
    client.post("/ui/logout", data={"csrf": csrf})
    read_csrf = signed_in(client, _read_key(client))
    assert 'href="/ui/submit"' not in client.get("/ui/jobs").text
    assert 'href="/ui/pool/ingest"' not in client.get("/ui/pool").text
    assert client.get("/ui/submit").status_code == 403 and client.get("/ui/pool/ingest").status_code == 403
    resp = client.post("/ui/submit", files={"archive": ("t.zip", target_zip())},
                       data={"csrf": read_csrf, "model_id": model_id, "method": "source"})
    assert resp.status_code == 403 and "may only read" in resp.text
    resp = client.post("/ui/pool/ingest", files={"files": ("a.png", png_image(1))},
                       data={"csrf": read_csrf, "source": "s"})
    assert resp.status_code == 403
    assert _job_dirs(tmp_path) == []
    for action in ("job.submit", "pool.ingest"):  # refused: recorded as such (issue 50)
        assert [(e["outcome"], e["detail"][:4]) for e in _audit(client, action)] == [("refused", "403:")]


def test_images_ingested_from_the_form_are_listed_per_file_and_audited(client: TestClient,
                                                                       pool: dict[str, Any]) -> None:
    csrf = signed_in(client)
    assert 'href="/ui/pool/ingest"' in client.get("/ui/pool").text
    assert client.get("/ui/pool/ingest").status_code == 200
    resp = client.post("/ui/pool/ingest", data={"csrf": csrf, "source": "field photos", "label": "red"},
                       files=[("files", ("a.png", png_image(1))), ("files", ("bad.png", b"nope"))])
    assert resp.status_code == 200, resp.text
    assert 'data-status="added"' in resp.text and 'data-status="rejected"' in resp.text
    assert "bad.png: not an image" in resp.text and "1 added" in resp.text
    assert [name for _, name, _ in pool["added"]] == ["a.png"]
    entry = _audit(client, "pool.ingest")[0]
    assert entry["target"] == "field photos" and entry["detail"] == "added=1 exists=0 duplicate=0 rejected=1"
    # every file refused: the per-file reasons, a 4xx, audited as refused
    resp = client.post("/ui/pool/ingest", data={"csrf": csrf, "source": "s"}, files={"files": ("bad.png", b"x")})
    assert resp.status_code == 422 and "bad.png: not an image" in resp.text
    assert _audit(client, "pool.ingest")[0]["outcome"] == "refused"
    for data, files, words in (({"source": ""}, {"files": ("a.png", b"x")}, "source tag"),
                               ({"source": "s"}, {"files": ("", b"")}, "choose image files"),
                               ({"source": "s", "extra": "1"}, {"files": ("a.png", b"x")}, "extra")):
        resp = client.post("/ui/pool/ingest", data={"csrf": csrf, **data}, files=files)
        assert resp.status_code == 422 and 'id="ingest-error"' in resp.text and words in resp.text, resp.text
    assert len(pool["added"]) == 1


def test_the_form_becomes_the_jobs_config() -> None:
    from starlette.datastructures import FormData

    assert config_of(FormData({"method": "tent", "preset": "", "fraction": " 0.25 ", "epochs": ""})) == \
        '{"method": "tent", "fraction": 0.25}'
    assert config_of(FormData({"method": "t3ar", "preset": "paper", "epochs": "4"})) == \
        '{"method": "t3ar", "preset": "paper", "epochs": 4}'


def test_an_ingest_over_its_cap_is_refused_before_it_is_read(tmp_path: Path, pool: dict[str, Any]) -> None:
    """The console's ingest holds the upload in the API's memory: T3AR_API_MAX_INGEST_BYTES bounds it (413 before
    the body is read), far below the target archives' limit."""
    settings = settings_for(tmp_path, max_ingest_bytes=200_000)
    assert settings.max_upload_bytes > 100 * settings.max_ingest_bytes
    with TestClient(app_for(settings, pool)) as c:
        csrf = signed_in(c)
        big = b"\x89PNG" + bytes(2_000_000)
        resp = c.post("/ui/pool/ingest", data={"csrf": csrf, "source": "s"}, files={"files": ("big.png", big)})
        assert resp.status_code == 413 and "T3AR_API_MAX_INGEST_BYTES" in resp.text
        assert pool.get("added", []) == []


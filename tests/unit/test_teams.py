"""Teams: the key store (digests only, revocation), the audit log (append-only, bounded, filtered), ownership in
the store, and the roles and team filters of the JSON API and the console (in-process, fakeredis, a mocked
retriever)."""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from console_kit import (
    app_for,
    csrf_of,
    finished_job,
    model_file,
    new_pool,
    settings_for,
    sign_in,
    signed_in,
    target_zip,
)
from fastapi.testclient import TestClient

from t3ar.errors import InvalidInputError
from t3ar_services.api.audit import AuditLog
from t3ar_services.api.keys import KeyStore, Principal
from t3ar_services.api.store import JobRow, ModelRow, Store
from t3ar_services.common.errors import NotFoundError

# --- the key store -----------------------------------------------------------------------------------------


def test_keys_are_stored_as_digests_and_revocation_is_immediate(tmp_path: Path) -> None:
    keys = KeyStore(tmp_path / "api.sqlite3")
    row, key = keys.create("vision", "submit", name="ci", created_by="token:admin")
    assert key.startswith(f"t3ar_{row.id}_") and len(key) > 50
    assert keys.lookup(key) == Principal(row.id, "vision", "submit")
    assert keys.lookup(key + "x") is None and keys.lookup("nope") is None
    keys.close()
    raw = (tmp_path / "api.sqlite3").read_bytes() + b"".join(p.read_bytes() for p in tmp_path.glob("api.sqlite3-*"))
    assert key.encode() not in raw and key.split("_")[-1].encode() not in raw  # the secret part is nowhere on disk
    keys = KeyStore(tmp_path / "api.sqlite3")
    assert keys.lookup(key) is not None and keys.active(row.id) is not None  # survives a restart
    first = keys.revoke(row.id)
    assert first.revoked_at is not None and keys.lookup(key) is None and keys.active(row.id) is None
    assert keys.revoke(row.id).revoked_at == first.revoked_at  # idempotent
    with pytest.raises(NotFoundError):
        keys.revoke("k-unknown")
    assert [k.id for k in keys.list()] == [row.id] and keys.list(revoked=False) == []


@pytest.mark.parametrize(("team", "role"), [("Vision", "submit"), ("", "read"), ("a" * 64, "read"),
                                            ("vision", "owner"), ("x/y", "read"), ("ok", "Admin")])
def test_bad_teams_and_roles_are_refused(tmp_path: Path, team: str, role: str) -> None:
    keys = KeyStore(tmp_path / "api.sqlite3")
    with pytest.raises(InvalidInputError):
        keys.create(team, role, created_by="t")
    assert keys.list() == []


def test_principal_roles() -> None:
    read, submit, admin = (Principal("k", "vision", r) for r in ("read", "submit", "admin"))  # type: ignore[arg-type]
    assert not read.can_submit and submit.can_submit and admin.can_submit
    assert read.sees("vision") and not read.sees({"audio"}) and admin.sees({"audio"}) and not submit.sees(set())
    assert (read.team_filter, admin.team_filter) == ("vision", None)
    assert (read.scope, submit.scope, admin.scope) == ("read", "token", "admin")


# --- the audit log -----------------------------------------------------------------------------------------


def test_audit_is_append_only_bounded_and_filtered(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "api.sqlite3", max_rows=100, max_age_days=1)
    for i in range(130):
        log.record(key_id=f"k{i % 2}", team="vision" if i % 2 else "audio", action="job.submit", target=f"j{i}",
                   client="127.0.0.1")
    assert log.count() == 130  # nothing an admin has not exported is pruned (issue 50, N9)
    assert len(log.export(after=0, limit=1000)[0]) == 130
    log.record(key_id="k0", team="audio", action="job.submit", target="j130", client="127.0.0.1")
    log.record(key_id="k1", team="vision", action="job.submit", target="j131", client="127.0.0.1")
    assert log.count() == 100  # exported: the oldest go past the bound
    page = log.page(limit=10, team="vision")
    assert [e.target for e in page] == [f"j{i}" for i in range(131, 111, -2)]
    older = log.page(limit=10, team="vision", before=page[-1].seq)
    assert older[0].target == "j111" and all(e.team == "vision" for e in older)
    assert log.page(limit=5, action="key.create") == []
    with sqlite3.connect(tmp_path / "api.sqlite3") as db, pytest.raises(sqlite3.DatabaseError, match="append-only"):
        db.execute("UPDATE audit SET team = 'x'")
    with sqlite3.connect(tmp_path / "api.sqlite3") as db:  # an entry older than the bound goes at the next record
        old = (dt.datetime.now(dt.UTC) - dt.timedelta(days=2)).isoformat()
        db.execute("INSERT INTO audit (at, key_id, team, action, target, client, outcome, detail) VALUES "
                   "(?, 'k', 't', 'sign_in', '', '', 'ok', '')", (old,))
    log.record(key_id="k", team="t", action="sign_out")
    assert any(e.at == old for e in log.page(limit=1000))  # old, but not exported: kept
    log.export(after=0, limit=1000)
    log.record(key_id="k", team="t", action="sign_out")
    assert all(e.at > old for e in log.page(limit=1000)) and log.count() == 99  # 35..134 less the old one (exported)


def test_audit_rows_are_rate_limited_per_key_and_never_pruned_unexported(tmp_path: Path) -> None:
    """N9 (issue 50): a submit key wrote ~170 audit rows a second and pushed the history out (rows pruned
    oldest-first past the bound). Now a key's rows past its budget a minute are not written one by one (one
    ``audit.rate_limited`` row says so, and how many when it writes again), and nothing an admin has not exported
    (``export``) is pruned."""
    clock = [1000.0]
    log = AuditLog(tmp_path / "api.sqlite3", max_rows=100, max_age_days=1, max_per_minute=20,
                   clock=lambda: clock[0])
    log.record(key_id="admin", team="t", action="key.create", target="k-1")
    first = log.page(limit=1)[0].seq
    for i in range(500):
        log.record(key_id="k-spam", team="t", action="job.download", target=f"j{i}")
    spam = [e for e in log.page(limit=1000) if e.key_id == "k-spam"]
    assert len(spam) == 21 and spam[0].action == "audit.rate_limited", [e.action for e in spam[:3]]
    log.record(key_id="admin", team="t", action="key.revoke", target="k-1")  # another key is not limited
    assert log.page(limit=1)[0].action == "key.revoke"
    clock[0] += 61
    log.record(key_id="k-spam", team="t", action="job.download", target="later")
    newest = log.page(limit=2)
    assert [e.action for e in newest] == ["job.download", "audit.rate_limited"]
    assert "480" in newest[1].detail  # how many were not written one by one
    assert min(e.seq for e in log.page(limit=1000)) == first  # the history is still there
    rows, nxt = log.export(after=0, limit=10)
    assert [r.seq for r in rows] == sorted(r.seq for r in rows) and rows[0].seq == first and nxt == rows[-1].seq


# --- ownership in the store --------------------------------------------------------------------------------


def _job(job_id: str, created: str) -> JobRow:
    return JobRow(job_id, "m", None, created, {}, f"jobs/{job_id}", 1, False, 0, "0" * 64)


def test_lists_filter_by_team(tmp_path: Path) -> None:
    path = tmp_path / "api.sqlite3"
    store = Store(path)
    store.add_job(_job("old", "2020"))
    store.add_owner("job", "old", "default", "")
    store.add_job(_job("v1", "2021"))
    store.add_owner("job", "v1", "vision", "k1")
    store.add_job(_job("nobody", "2022"))  # made without an owner (a crash in between): admins only
    assert [r.id for r in store.list_jobs(limit=10, team="vision")] == ["v1"]
    assert [r.id for r in store.list_jobs(limit=10, team="default")] == ["old"]
    assert [r.id for r in store.list_jobs(limit=10)] == ["nobody", "v1", "old"]
    assert [r.id for r in store.list_jobs(limit=10, team="vision", before="nobody")] == ["v1"]
    assert (store.count_jobs("vision"), store.count_jobs()) == (1, 3)
    store.delete_job("v1")
    assert store.teams_of("job", "v1") == set() and store.count_jobs("vision") == 0
    store.add_model(ModelRow(id="m", name="m", sha256="0" * 64, size=1, arch="a", image_size=32, num_classes=1,
                             classes=["a"], uploaded_at="2020", feature_dim=8))
    store.add_owner("model", "m", "vision", "k1")
    store.add_owner("model", "m", "audio", "k2")  # the same file uploaded by two teams belongs to both
    assert [m.id for m in store.list_models("audio")] == ["m"] and store.list_models("default") == []
    store.close()
    assert Store(path).teams_of("job", "nobody") == set()  # reopened: no owner is made up


# --- the API and the console -------------------------------------------------------------------------------


@pytest.fixture()
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(app_for(settings_for(tmp_path), new_pool())) as c:
        yield c


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _key(client: TestClient, team: str, role: str) -> tuple[str, str]:
    resp = client.post("/keys", json={"team": team, "role": role, "name": f"{team} {role}"}, headers=_auth("admin-t"))
    assert resp.status_code == 201, resp.text
    assert resp.headers["cache-control"] == "no-store"
    return resp.json()["id"], resp.json()["key"]


def _submit(client: TestClient, token: str, model_id: str) -> Any:
    return client.post("/adapt", files={"archive": ("t.zip", target_zip())}, headers=_auth(token),
                       data={"model_id": model_id, "config": json.dumps({"method": "source"})})


def test_two_teams_see_only_their_own(client: TestClient, tmp_path: Path) -> None:
    vision_id, vision = _key(client, "vision", "submit")
    vision_read_id, vision_read = _key(client, "vision", "read")
    audio_id, audio = _key(client, "audio", "submit")
    model = client.post("/models", files={"file": ("m.pt", model_file(tmp_path))}, headers=_auth(vision))
    assert model.status_code == 201, model.text
    model_id = model.json()["id"]
    job = _submit(client, vision, model_id)
    assert job.status_code == 202, job.text
    job_id = job.json()["id"]

    unknown = client.get("/jobs/0123456789abcdef", headers=_auth(audio)).json()["error"]["message"]
    for path in (f"/jobs/{job_id}", f"/jobs/{job_id}/checkpoint", f"/jobs/{job_id}/report"):
        resp = client.get(path, headers=_auth(audio))
        assert resp.status_code == 404, (path, resp.text)  # as an unknown job: the id tells nothing
    assert client.get(f"/jobs/{job_id}", headers=_auth(audio)).json()["error"]["message"] == \
        unknown.replace("0123456789abcdef", job_id)
    for method, path in (("POST", f"/jobs/{job_id}/cancel"), ("POST", f"/jobs/{job_id}/readapt")):
        assert client.request(method, path, headers=_auth(audio)).status_code == 404
    assert client.get("/jobs", headers=_auth(audio)).json() == {"jobs": [], "total": 0, "next_before": None}
    assert client.get("/models", headers=_auth(audio)).json()["models"] == []
    assert client.get(f"/models/{model_id}", headers=_auth(audio)).status_code == 404
    assert _submit(client, audio, model_id).status_code == 404  # another team's model cannot be used
    assert [j["id"] for j in client.get("/jobs", headers=_auth("user-t")).json()["jobs"]] == []  # default team

    for token in (vision, vision_read, "admin-t"):
        listed = client.get("/jobs", headers=_auth(token)).json()
        assert [j["id"] for j in listed["jobs"]] == [job_id] and listed["total"] == 1
        assert client.get(f"/jobs/{job_id}", headers=_auth(token)).status_code == 200
        assert [m["id"] for m in client.get("/models", headers=_auth(token)).json()["models"]] == [model_id]

    # a read key reads but submits nothing: 403 before the upload is read
    assert _submit(client, vision_read, model_id).status_code == 403
    assert client.post(f"/jobs/{job_id}/cancel", headers=_auth(vision_read)).status_code == 403
    # keys and the audit are admin's
    for token in (vision, vision_read):
        assert client.get("/keys", headers=_auth(token)).status_code == 403
        assert client.get("/audit", headers=_auth(token)).status_code == 403
        assert client.delete("/pool/p-1", headers=_auth(token)).status_code == 403
    assert client.post("/keys", json={"team": "x", "role": "read"}, headers=_auth(vision)).status_code == 403

    readapt = client.post(f"/jobs/{job_id}/readapt", headers=_auth(vision))
    assert readapt.status_code == 202
    assert client.get(f"/jobs/{readapt.json()['id']}", headers=_auth(audio)).status_code == 404
    assert client.get("/jobs", headers=_auth(vision)).json()["total"] == 2

    # revoked: refused at once
    assert client.delete(f"/keys/{audio_id}", headers=_auth("admin-t")).json()["revoked_at"]
    assert client.get("/jobs", headers=_auth(audio)).status_code == 401
    assert client.delete("/keys/k-none", headers=_auth("admin-t")).status_code == 404
    listed_keys = client.get("/keys", headers=_auth("admin-t")).json()["keys"]
    assert {k["id"] for k in listed_keys} >= {vision_id, audio_id} and all("key" not in k for k in listed_keys)

    audit = client.get("/audit", params={"team": "vision"}, headers=_auth("admin-t")).json()["entries"]
    seen = [(e["action"], e["key_id"], e["target"]) for e in reversed(audit) if e["outcome"] == "ok"]
    assert seen == [("model.upload", vision_id, model_id), ("job.submit", vision_id, job_id),
                    ("job.readapt", vision_id, readapt.json()["id"])]
    refused = [(e["action"], e["key_id"], e["target"], e["detail"][:4]) for e in reversed(audit)
               if e["outcome"] == "refused"]  # issue 50: refusals are recorded too
    assert ("pool.withdraw", vision_id, "p-1", "403:") in refused
    assert ("pool.withdraw", vision_read_id, "p-1", "403:") in refused
    assert all(e["client"] == "testclient" for e in audit)
    keys_audit = client.get("/audit", params={"action": "key.revoke"}, headers=_auth("admin-t")).json()["entries"]
    assert [(e["key_id"], e["target"]) for e in keys_audit] == [("token:admin", audio_id)]
    page = client.get("/audit", params={"limit": 2}, headers=_auth("admin-t")).json()
    assert len(page["entries"]) == 2 and page["next_before"] == page["entries"][-1]["seq"]
    # a cursor past SQLite's integer range is a 422, not a 500 (the OpenAPI fuzzer found the 500)
    huge = client.get("/audit", params={"before": 2**63}, headers=_auth("admin-t"))
    assert huge.status_code == 422, huge.text


def test_bad_key_requests_are_422(client: TestClient) -> None:
    for body in ({"team": "Vision", "role": "read"}, {"team": "v", "role": "owner"}, {"team": "v"},
                 {"team": "v", "role": "read", "extra": 1}, {"team": "v", "role": "read", "name": "a\nb"}):
        resp = client.post("/keys", json=body, headers=_auth("admin-t"))
        assert resp.status_code == 422, (body, resp.text)
    assert client.get("/keys", headers=_auth("admin-t")).json()["keys"] == []


def test_console_sessions_follow_the_key(client: TestClient, tmp_path: Path) -> None:
    vision_id, vision = _key(client, "vision", "submit")
    _, audio = _key(client, "audio", "read")
    model_id = client.post("/models", files={"file": ("m.pt", model_file(tmp_path))},
                           headers=_auth(vision)).json()["id"]
    job_id = _submit(client, vision, model_id).json()["id"]

    assert sign_in(client, audio).status_code == 303
    page = client.get("/ui/jobs")
    assert page.status_code == 200 and job_id not in page.text and "audio · read" in page.text
    assert client.get(f"/ui/jobs/{job_id}").status_code == 404
    assert client.get("/ui/keys").status_code == 403 and client.get("/ui/audit").status_code == 403
    assert 'href="/ui/keys"' not in page.text
    csrf = csrf_of(page.text)
    assert client.post(f"/ui/jobs/{job_id}/cancel", data={"csrf": csrf}).status_code == 403  # read: no actions

    client.cookies.clear()
    assert sign_in(client, vision).status_code == 303
    page = client.get("/ui/jobs")
    assert job_id in page.text and client.get(f"/ui/jobs/{job_id}").status_code == 200
    assert client.delete(f"/keys/{vision_id}", headers=_auth("admin-t")).status_code == 200
    gone = client.get("/ui/jobs", follow_redirects=False)  # the revoked key's session ends at once
    assert gone.status_code == 303 and gone.headers["location"].startswith("/ui/login")

    client.cookies.clear()
    assert sign_in(client, "wrong-token").status_code == 401
    csrf = csrf_of(client.get("/ui/login").text)
    assert sign_in(client, "admin-t").status_code == 303
    page = client.get("/ui/keys")
    assert page.status_code == 200 and vision_id in page.text and 'href="/ui/audit"' in page.text
    csrf = csrf_of(page.text)
    assert client.post("/ui/keys", data={"team": "nlp", "role": "read"}).status_code == 403  # no CSRF token
    made = client.post("/ui/keys", data={"csrf": csrf, "team": "nlp", "role": "read", "name": "<b>x</b>"})
    assert made.status_code == 200 and 'id="new-key">t3ar_' in made.text and "&lt;b&gt;x&lt;/b&gt;" in made.text
    new_id = made.text.split('id="created-key">Key <code>')[1].split("<")[0]
    assert client.get("/ui/keys").text.count("t3ar_k") == 0  # the key itself is never shown again
    revoke = client.post(f"/ui/keys/{new_id}/revoke", data={"csrf": csrf}, follow_redirects=False)
    assert revoke.status_code == 303
    audit = client.get("/ui/audit", params={"action": "sign_in"})
    assert audit.status_code == 200 and audit.text.count('data-action="sign_in"') == 4  # 3 ok, 1 refused
    assert "refused" in audit.text
    entries = client.get("/audit", headers=_auth("admin-t")).json()["entries"]
    assert [e["action"] for e in entries[:2]] == ["key.revoke", "key.create"]
    assert entries[0]["target"] == new_id and entries[0]["key_id"] == "token:admin"


def test_a_read_key_is_refused_before_its_upload_is_read(tmp_path: Path) -> None:
    """The credentials-first check knows a key's role: a read key's submission is a 403 (not the 413 or 422 its
    body would get), a revoked or made-up key's a 401, before any byte of the body is read."""
    settings = settings_for(tmp_path, max_upload_bytes=200_000, max_model_bytes=100_000)
    with TestClient(app_for(settings, new_pool())) as client:
        read_id, read = _key(client, "vision", "read")
        revoked_id, revoked = _key(client, "vision", "submit")
        client.delete(f"/keys/{revoked_id}", headers=_auth("admin-t"))
        big = b"x" * (settings.max_body_bytes + 1)
        for path, content, ctype in (("/adapt", big, "multipart/form-data; boundary=x"),
                                     ("/models", big, "multipart/form-data; boundary=x"),
                                     ("/jobs/x/readapt", b"{not json", "application/json")):
            resp = client.post(path, content=content, headers={"Content-Type": ctype, **_auth(read)})
            assert resp.status_code == 403 and "role submit" in resp.json()["error"]["message"], (path, resp.text)
            for token in (revoked, read[:-1] + ("A" if read[-1] != "A" else "B")):
                resp = client.post(path, content=content, headers={"Content-Type": ctype, **_auth(token)})
                assert resp.status_code == 401, (path, resp.text)
            resp = client.post("/keys", content=b"{not json", headers={"Content-Type": "application/json",
                                                                       **_auth(read)})
            assert resp.status_code == 403  # an admin route
        assert client.get("/jobs", headers=_auth(read)).status_code == 200
        assert client.get("/audit", params={"key_id": read_id}, headers=_auth("admin-t")).json()["entries"] == []


def test_a_lineage_names_only_the_jobs_its_reader_may_see(client: TestClient, tmp_path: Path) -> None:
    """The pool is shared, its lineage is not: another team's key reads the item, not which jobs used it."""
    job_id = finished_job(client, tmp_path, signed_in(client, "user-t"))  # the default team's
    _, vision = _key(client, "vision", "read")
    for token, seen in (("user-t", [job_id]), ("admin-t", [job_id]), (vision, [])):
        found = client.get("/pool/p-1/lineage", headers=_auth(token)).json()
        assert [j["job_id"] for j in found["jobs"]] == seen, token
    client.cookies.clear()
    assert sign_in(client, vision).status_code == 303
    item = client.get("/ui/pool/p-1")
    assert item.status_code == 200 and job_id[:12] not in item.text
    assert client.get("/ui/pool").status_code == 200 and client.get(f"/ui/jobs/{job_id}/checkpoint").status_code == 404


def test_another_teams_upload_of_the_same_file_is_not_revealed(client: TestClient, tmp_path: Path) -> None:
    """N6 (issue 50): uploading the exact file another team uploaded answered with that team's name for it and its
    upload time (and 200, "uploaded before"). Each team sees its own upload: its name, its time, 201 the first
    time it uploads it."""
    _, vision = _key(client, "vision", "submit")
    _, audio = _key(client, "audio", "submit")
    data = model_file(tmp_path)
    first = client.post("/models", files={"file": ("m.pt", data)}, data={"name": "vision-secret"},
                        headers=_auth(vision))
    assert first.status_code == 201, first.text
    theirs = client.post("/models", files={"file": ("m.pt", data)}, data={"name": "audio-model"},
                         headers=_auth(audio))
    assert theirs.status_code == 201, theirs.text  # not "the same file was uploaded before"
    assert theirs.json()["id"] == first.json()["id"] and theirs.json()["name"] == "audio-model"
    assert "vision-secret" not in theirs.text
    again = client.post("/models", files={"file": ("m.pt", data)}, data={"name": "renamed"}, headers=_auth(audio))
    assert again.status_code == 200 and again.json()["name"] == "audio-model"  # its own earlier upload
    assert again.json()["uploaded_at"] == theirs.json()["uploaded_at"]
    for token, name in ((audio, "audio-model"), (vision, "vision-secret")):
        assert [m["name"] for m in client.get("/models", headers=_auth(token)).json()["models"]] == [name]
        assert client.get(f"/models/{first.json()['id']}", headers=_auth(token)).json()["name"] == name


def test_a_job_does_not_name_another_teams_contributing_job(client: TestClient, tmp_path: Path) -> None:
    """N6 (issue 50): ``neighbours_from_contributions`` named another team's job id; now such a contribution is
    counted without its job (an admin still sees it)."""
    job_id = finished_job(client, tmp_path, signed_in(client, "user-t"))  # the default team's; it used p-1, p-2
    state = client.app.state.api  # type: ignore[attr-defined]
    state.store.add_owner("job", "0123456789abcdef", "vision", "k-x")
    state.contributor.records.record_items("0123456789abcdef", ["p-1"])
    state.jobs.sync_lineage()
    for path in (f"/jobs/{job_id}", f"/jobs/{job_id}/report", "/jobs"):
        got = client.get(path, headers=_auth("user-t"))
        assert got.status_code == 200 and "0123456789abcdef" not in got.text, (path, got.text)
    seen = client.get(f"/jobs/{job_id}", headers=_auth("user-t")).json()["neighbours_from_contributions"]
    assert seen == [{"job_id": None, "source": "another team's contribution", "items_used": 1}], seen
    admin = client.get(f"/jobs/{job_id}", headers=_auth("admin-t")).json()["neighbours_from_contributions"]
    assert [n["job_id"] for n in admin] == ["0123456789abcdef"]


def test_the_audit_export_route(client: TestClient) -> None:
    _, vision = _key(client, "vision", "submit")
    assert client.get("/audit/export", headers=_auth(vision)).status_code == 403
    got = client.get("/audit/export", params={"after": 0, "limit": 1}, headers=_auth("admin-t")).json()
    assert [e["action"] for e in got["entries"]] == ["key.create"] and got["next_after"] == got["entries"][0]["seq"]
    rest = client.get("/audit/export", params={"after": got["next_after"]}, headers=_auth("admin-t")).json()
    assert rest["next_after"] is None and all(e["seq"] > got["next_after"] for e in rest["entries"])
    assert client.get("/audit", params={"action": "audit.export"}, headers=_auth("admin-t")).json()["entries"]


def test_a_read_keys_console_uploads_are_refused_before_their_body_is_read(client: TestClient,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """N11 (issue 50): a read key's console ingest was refused only after its whole body was read (and parsed);
    the console's ingest, submit and model upload now check the role first, like the JSON API."""
    from starlette.requests import Request

    _, read = _key(client, "vision", "read")
    csrf = signed_in(client, read)
    parsed: list[str] = []
    original = Request.form

    def form(self: Request, **kw: Any) -> Any:
        parsed.append(self.url.path)
        return original(self, **kw)

    monkeypatch.setattr(Request, "form", form)
    for path in ("/ui/pool/ingest", "/ui/submit", "/ui/models"):
        resp = client.post(path, data={"csrf": csrf, "source": "x"}, files={"files": ("a.png", b"x" * 1000)})
        assert resp.status_code == 403 and "may only read" in resp.text, (path, resp.status_code)
    assert parsed == []

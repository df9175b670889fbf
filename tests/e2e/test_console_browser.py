"""The web console in a real headless Chromium (Debian's ``chromium``, driven by Playwright; never a browser a
tool downloads) against the real embedded stack (`t3ar up`: Redis, retriever, API, one worker).

One stack and one browser for the module; a handful of tests in order: sign in and watch a job submitted from
the CLI finish, its neighbours; the pool, search and hostile strings; models; a user cannot withdraw; an admin
withdraws (lineage, the re-run, the original job marked stale, then gone from search); an admin makes and revokes
a key and reads the audit log; no page answers 5xx. Each page is screenshotted by this browser:
into ``$T3AR_CONSOLE_SCREENSHOTS`` when set (``docs/console`` refreshes docs/console.md's), else a tmp dir.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from stack_helpers import (
    CLASSES,
    FAST_JOB,
    ROOT,
    Stack,
    inherited_path,
    png,
    running_stack,
    target_zip,
    tiny_checkpoint,
    upload_tiny_model,
    wait_for,
)

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
HOSTILE = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'
JS_URL = "javascript:alert(3)"

if CHROMIUM is None:
    pytest.skip("no chromium on this machine: scripts/setup.sh installs Debian's package when it runs as root "
                "(or: sudo apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extra: bash scripts/setup.sh")


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = os.environ.get("T3AR_CONSOLE_SCREENSHOTS")
    path = Path(where) if where else tmp_path_factory.mktemp("console-shots")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def console_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("console-stack")) as st:
        yield st


@pytest.fixture(scope="module")
def pool(console_stack: Stack) -> list[str]:
    """24 pool images; a third under a hostile source with hostile metadata and file names."""
    rng = np.random.default_rng(7)
    ids: list[str] = []
    with console_stack.retriever() as rc:
        for source, meta, n in (("emoji-google", {"licence": "Apache-2.0"}, 16),
                                (HOSTILE, {"caption": HOSTILE, "url": JS_URL}, 8)):
            images = [(f"{HOSTILE if source == HOSTILE else 'img'}-{i}.png", png(CLASSES[i % 3], rng))
                      for i in range(n)]
            out = rc.add_images(images, source=source, metadata=meta, duplicate_policy="keep")
            ids += [it.id for it in out.items if it.status == "added"]
    assert len(ids) == 24
    return ids


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def _cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "shared"), str(ROOT), *inherited_path()]),
               T3AR_API_URL=stack.info["api_url"], T3AR_API_TOKEN=stack.info["tokens"]["api_token"])
    return subprocess.run([sys.executable, "-m", "t3ar.cli.job_cmd", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)


class Console:
    """One signed-in browser context; records every console answer's status and any dialog (an alert would
    mean a hostile string ran)."""

    def __init__(self, browser: Any, stack: Stack, token: str) -> None:
        self.base = stack.info["console_url"]
        self.token = token
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        self.page = self.context.new_page()
        self.page.set_default_timeout(30_000)
        self.statuses: list[tuple[int, str]] = []
        self.dialogs: list[str] = []
        self.page.on("response", lambda r: self.statuses.append((r.status, r.url)))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.goto(f"{self.base}/jobs")
        assert "/ui/login" in self.page.url
        self.page.fill("#token", token)
        self.page.click("#sign-in")
        self.page.wait_for_url("**/ui/jobs")

    def go(self, path: str) -> Any:
        resp = self.page.goto(self.base + path)
        assert resp is not None
        return resp

    def images_loaded(self) -> list[bool]:
        """Waits for every image of the page to finish; whether each one loaded."""
        self.page.wait_for_function("() => Array.from(document.images).every(i => i.complete)")
        return list(self.page.eval_on_selector_all("img", "els => els.map(e => e.naturalWidth > 0)"))

    def shot(self, shots: Path, name: str) -> None:
        self.images_loaded()
        self.page.screenshot(path=str(shots / f"{name}.png"), full_page=True)

    def csrf(self) -> str:
        return str(self.page.get_attribute("input[name=csrf]", "value"))

    def close(self) -> None:
        assert not [s for s in self.statuses if s[0] >= 500], self.statuses
        assert self.dialogs == [], self.dialogs
        self.context.close()


@pytest.fixture(scope="module")
def admin(browser: Any, console_stack: Stack) -> Iterator[Console]:
    c = Console(browser, console_stack, console_stack.info["tokens"]["api_admin_token"])
    yield c
    c.close()


@pytest.fixture(scope="module")
def user(browser: Any, console_stack: Stack) -> Iterator[Console]:
    c = Console(browser, console_stack, console_stack.info["tokens"]["api_token"])
    yield c
    c.close()


@pytest.fixture(scope="module")
def model_id(console_stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> str:
    return upload_tiny_model(console_stack, tmp_path_factory.mktemp("console-models"), "tiny emoji classifier")


@pytest.fixture(scope="module")
def job_id(console_stack: Stack, pool: list[str], model_id: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A small labelled job submitted from the CLI (not followed: the console watches it)."""
    archive = target_zip(tmp_path_factory.mktemp("console-target") / "target.zip", per_class=4)
    extra = {k: v for k, v in FAST_JOB.items() if k not in ("k", "epochs", "method")}
    sub = _cli(console_stack, "submit", str(archive), "--model", model_id, "--method", "t3ar", "--k", "2",
               "--epochs", "20", "--mode", "test", "--config", json.dumps(extra), "--no-follow", "--json")
    assert sub.returncode == 0, sub.stderr
    return str(json.loads(sub.stdout)["id"])


def _no_secret_in_browser(c: Console) -> None:
    page = c.page
    assert c.token not in page.content() and c.token not in page.url
    assert page.evaluate("() => JSON.stringify(localStorage) + JSON.stringify(sessionStorage) + document.cookie") \
        == "{}{}"  # the session cookie is HttpOnly: invisible to scripts
    cookie = next(k for k in c.context.cookies() if k["name"] == "t3ar_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui"
    assert c.token not in cookie["value"]


def test_sign_in_and_watch_a_cli_job_finish_with_its_neighbours(admin: Console, job_id: str, shots: Path) -> None:
    _no_secret_in_browser(admin)
    page = admin.page
    admin.go("/jobs")
    row = f"tr[data-job='{job_id}']"
    page.wait_for_selector(row)
    assert page.text_content(f"{row} .status") in ("queued", "started")  # 20 epochs: still running
    assert page.locator("meta[http-equiv=refresh]").count() == 1
    admin.shot(shots, "jobs")
    loads = len(admin.statuses)
    # no reload from here: the page refreshes itself while jobs run, until this one shows finished
    page.wait_for_selector(f"{row} .status.finished", timeout=240_000)
    assert len(admin.statuses) > loads and page.locator("meta[http-equiv=refresh]").count() == 0
    page.click(f"{row} a")
    page.wait_for_selector("#job-status")
    assert page.text_content("#job-status") == "finished"
    page.wait_for_selector("#neighbours img.neighbour")
    page.wait_for_load_state("networkidle")
    loaded = page.eval_on_selector_all("#neighbours img", "els => els.map(e => e.complete && e.naturalWidth > 0)")
    assert loaded and all(loaded), loaded  # target and neighbour thumbnails, through the API
    assert page.locator("#neighbours figcaption").first.text_content()
    assert page.locator("#charts svg polyline").count() >= 2
    assert page.locator("#lineage img").count() >= 1
    admin.shot(shots, "job")
    with page.expect_download() as dl:
        page.click("#download-report")
    assert json.loads(Path(dl.value.path()).read_text())["job_id"] == job_id


def test_a_job_page_follows_its_job_from_queued_to_finished_and_offers_three_downloads(
        admin: Console, console_stack: Stack, model_id: str, job_id: str, shots: Path,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """The job page of a queued job (the one worker is busy with another) refreshes itself until the job finished,
    without a reload by the test; then it stops refreshing and offers the checkpoint, ONNX and safetensors."""
    with console_stack.api() as api:
        wait_for(lambda: api.job(job_id).status == "finished", 240, "the first job")  # the worker is free
    archive = target_zip(tmp_path_factory.mktemp("console-follow") / "target.zip", per_class=2)
    extra = {k: v for k, v in FAST_JOB.items() if k not in ("k", "epochs", "method")}
    ids = []
    for epochs in ("1000", "3"):  # the first holds the worker while the second waits in the queue
        sub = _cli(console_stack, "submit", str(archive), "--model", model_id, "--method", "t3ar", "--k", "2",
                   "--epochs", epochs, "--mode", "test", "--config", json.dumps(extra), "--no-follow", "--json")
        assert sub.returncode == 0, sub.stderr
        ids.append(str(json.loads(sub.stdout)["id"]))
    blocker, watched = ids
    page = admin.page
    with console_stack.api() as api:
        wait_for(lambda: api.job(blocker).status == "started", 120, "the blocking job to start")
        url = f"{admin.base}/jobs/{watched}"
        admin.go(f"/jobs/{watched}")
        assert page.text_content("#job-status") == "queued"
        assert "waiting for a worker" in (page.text_content("#job-where") or "")  # what it waits for (issue 50)
        assert page.locator("meta[http-equiv=refresh]").count() == 1
        assert page.locator("#download-onnx").count() == 0  # nothing to download yet
        loads = sum(1 for _, u in admin.statuses if u == url)
        api.cancel(blocker)
    # no reload from here: the page refreshes itself while the job waits and runs, until it shows finished
    page.wait_for_selector("#job-status.finished", timeout=240_000)
    assert sum(1 for _, u in admin.statuses if u == url) > loads
    assert page.locator("meta[http-equiv=refresh]").count() == 0  # it stopped following
    import onnxruntime as ort
    import torch

    from t3ar.models.checkpoint import load_checkpoint

    # an export is made on its first download (its parity check runs the model): seconds on an idle machine, a
    # minute or more on a loaded CI runner, hence waits longer than Playwright's default 30 s
    with page.expect_download(timeout=180_000) as dl:
        page.click("#download-onnx")  # made now, on the first request: the page says so while it is made
        page.wait_for_selector("#busy-note.busy")
        assert "Making the ONNX export" in (page.text_content("#busy-note") or "")
        page.screenshot(path=str(shots / "export-busy.png"))  # the top of the page: the note
    onnx_file = Path(dl.value.path()).read_bytes()
    assert dl.value.suggested_filename.endswith(".onnx")
    page.wait_for_selector("#busy-note.ok")  # and that it is done
    session = ort.InferenceSession(onnx_file, providers=["CPUExecutionProvider"])
    assert json.loads(session.get_modelmeta().custom_metadata_map["t3ar.classes"]) == list(CLASSES)
    with page.expect_download(timeout=180_000) as dl:
        page.click("#download-safetensors")
    st = tmp_path_factory.mktemp("console-downloads") / "m.safetensors"
    shutil.copy(dl.value.path(), st)
    with page.expect_download() as dl:
        page.click("#download-checkpoint")
    a, _ = load_checkpoint(Path(dl.value.path()))
    b, info = load_checkpoint(st)
    assert info.spec.classes == CLASSES and all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    admin.go(f"/jobs/{watched}")
    assert page.locator("#exports tr").count() == 2  # the two exports, with their sha256 and parity
    # the CLI downloads the same file, checked against the sha256 the job records
    out = tmp_path_factory.mktemp("cli-download") / "m.onnx"
    got = _cli(console_stack, "jobs", "download", watched, str(out), "--format", "onnx")
    assert got.returncode == 0, got.stderr
    assert out.read_bytes() == onnx_file
    admin.shot(shots, "job-exports")


def test_the_console_submits_a_job_and_its_page_follows_it(admin: Console, model_id: str, shots: Path,
                                                          tmp_path: Path) -> None:
    """The submit form (the same checks as POST /adapt): a refused archive comes back with the reason, then a
    tiny job is accepted and its page, then the jobs list, show it."""
    page = admin.page
    admin.go("/jobs")
    page.click("#new-job")
    page.wait_for_selector("#submit-form")
    bad = tmp_path / "bad.zip"
    bad.write_bytes(b"not an archive")
    page.set_input_files("#archive", str(bad))
    page.select_option("#model", model_id)
    page.select_option("#method", "source")
    page.fill("#epochs", "1")
    page.click("#submit-job")
    page.wait_for_selector("#submit-error")
    assert page.url.endswith("/ui/submit") and page.input_value("#epochs") == "1"
    archive = target_zip(tmp_path / "target.zip", per_class=2, seed=5, labels=False)
    page.set_input_files("#archive", str(archive))
    page.select_option("#model", model_id)
    page.select_option("#method", "source")
    page.select_option("#mode", "test")  # the mode field (issue 50)
    page.fill("#epochs", "")  # source trains nothing: a schedule for it is refused, naming it (issue 53)
    admin.shot(shots, "submit")
    page.click("#submit-job")
    page.wait_for_url("**/ui/jobs/*")
    job = page.url.rsplit("/", 1)[1]
    assert job in (page.text_content("h1") or "")
    page.wait_for_selector("#job-status.finished", timeout=240_000)  # the page follows it by itself
    assert "source" in (page.text_content("#returned") or "")  # the headline: what the job returns
    admin.go("/jobs")
    assert page.text_content(f"tr[data-job='{job}'] .status") == "finished"
    assert "source" in (page.text_content(f"tr[data-job='{job}']") or "")


def test_pool_grid_search_and_hostile_strings_as_text(admin: Console, pool: list[str], shots: Path,
                                                      tmp_path: Path) -> None:
    page = admin.page
    admin.go("/pool")
    assert page.locator("#pool-grid img").count() == 24
    assert all(admin.images_loaded())  # every thumbnail came through the API
    assert HOSTILE in page.text_content("#sources")  # shown as text
    assert page.locator("img[src=x]").count() == 0
    admin.shot(shots, "pool")
    admin.go("/pool?source=" + urllib.parse.quote(HOSTILE))
    assert page.locator("#pool-grid img").count() == 8
    admin.go(f"/pool/{pool[-1]}")
    meta = page.text_content("#item-meta") or ""
    assert HOSTILE in meta and JS_URL in meta and page.locator("a[href^='javascript']").count() == 0
    admin.shot(shots, "pool-item")
    query = tmp_path / "query.png"
    query.write_bytes(_pool_image(admin, pool[0]))
    admin.go("/pool/search")
    page.set_input_files("#query-image", str(query))
    page.click("#search")
    page.wait_for_selector("#results li")
    ids = page.eval_on_selector_all("#results li", "els => els.map(e => e.dataset.id)")
    assert ids[0] == pool[0]  # the image itself is its own nearest neighbour
    admin.shot(shots, "search")


def _pattern(kind: int) -> bytes:
    """An image unlike the pool's noisy colour squares (so not a near-duplicate of one): stripes or a checkerboard."""
    import io

    from PIL import Image

    y, x = np.mgrid[0:64, 0:64]
    mask = (x // 8) % 2 == 0 if kind == 0 else ((x // 16) + (y // 16)) % 2 == 0
    a = np.where(mask[..., None], np.uint8([250, 220, 30]), np.uint8([40, 0, 90])).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    return buf.getvalue()


def test_the_console_ingests_images_into_the_pool(admin: Console, pool: list[str], shots: Path,
                                                 tmp_path: Path) -> None:
    page = admin.page
    admin.go("/pool")
    page.click("#add-images")
    page.wait_for_selector("#ingest-form")
    files = []
    for i in range(2):
        files.append(tmp_path / f"pattern-{i}.png")
        files[-1].write_bytes(_pattern(i))
    page.set_input_files("#ingest-files", [str(f) for f in files])
    page.fill("#ingest-source", "console-e2e")
    page.fill("#ingest-label", "patterns")
    page.click("#ingest-submit")
    page.wait_for_selector("#ingest-items")
    statuses = page.eval_on_selector_all("#ingest-items tr[data-status]", "els => els.map(e => e.dataset.status)")
    assert statuses == ["added", "added"], page.text_content("#ingest-items")
    admin.shot(shots, "ingest")
    page.click("#ingest-pool-link")
    page.wait_for_selector("#pool-grid")
    assert page.locator("#pool-grid img").count() == 2 and all(admin.images_loaded())
    assert "patterns" in (page.text_content("#pool-grid") or "")


def _pool_image(c: Console, pool_id: str) -> bytes:
    resp = c.page.request.get(f"{c.base}/pool/{pool_id}/image")
    assert resp.status == 200 and resp.headers["content-type"] == "image/png"
    return bytes(resp.body())


def test_models_list_and_upload_with_a_hostile_name(admin: Console, model_id: str, shots: Path,
                                                    tmp_path: Path) -> None:
    page = admin.page
    admin.go("/models")
    assert model_id in (page.text_content("#models") or "")
    ckpt = tiny_checkpoint(tmp_path / f"{'x' * 3}.pt", ("cat", "dog"))
    page.set_input_files("#model-file", str(ckpt))
    page.fill("#model-name", HOSTILE)
    page.click("#upload-model")
    page.wait_for_selector("#uploaded")
    assert HOSTILE in (page.text_content("#uploaded") or "") and HOSTILE in (page.text_content("#models") or "")
    assert page.locator("img[src=x]").count() == 0
    admin.shot(shots, "models")


def test_a_link_from_another_site_opens_the_page_signed_in(user: Console, job_id: str) -> None:
    """The session cookie is SameSite=Strict, so a link from another site arrives without it; the console reloads
    the page from its own origin once, and the user lands on it signed in (not on the sign-in page)."""
    page = user.page
    link = f"{user.base}/jobs/{job_id}"
    page.goto("data:text/html,<a id=go href='" + link + "'>a link in a chat</a>")
    page.click("#go")
    page.wait_for_selector("#job-status")
    assert page.url == link


def test_a_user_token_cannot_withdraw(user: Console, pool: list[str], job_id: str) -> None:
    page = user.page
    _no_secret_in_browser(user)
    user.go(f"/pool/{pool[0]}")
    assert page.locator("#withdraw").count() == 0
    assert user.go(f"/pool/{pool[0]}/withdraw").status == 403
    user.go("/jobs")
    csrf = user.csrf()
    forced = page.request.post(f"{user.base}/pool/{pool[0]}/withdraw", form={"csrf": csrf})
    assert forced.status == 403 and "admin token" in forced.text()
    no_csrf = page.request.post(f"{user.base}/jobs/{job_id}/readapt", form={})
    assert no_csrf.status == 403 and "CSRF" in no_csrf.text()
    assert user.go(f"/pool/{pool[0]}").status == 200 and page.locator("#item-meta").count() == 1  # still there


def test_admin_withdraws_an_item_sees_its_lineage_and_search_no_longer_returns_it(
        admin: Console, console_stack: Stack, job_id: str, shots: Path, tmp_path: Path) -> None:
    with console_stack.api() as api:
        wait_for(lambda: api.job(job_id).status == "finished", 240, "the job")
    page = admin.page
    admin.go(f"/jobs/{job_id}")
    used = urllib.parse.unquote(str(page.get_attribute("#lineage a", "href")).rsplit("/", 1)[1])
    query = tmp_path / "used.png"
    query.write_bytes(_pool_image(admin, used))
    admin.go(f"/pool/{used}")
    assert job_id[:12] in (page.text_content("#item-lineage") or "")
    page.click("#withdraw")
    page.wait_for_selector("#confirm-withdraw")
    assert job_id[:12] in (page.text_content("#item-lineage") or "")  # what is affected, before confirming
    admin.shot(shots, "withdraw-confirm")
    page.click("#confirm-withdraw")
    page.wait_for_selector("#withdrawn")
    assert job_id[:12] in (page.text_content("#item-lineage") or "")
    admin.shot(shots, "withdrawn")
    page.click("#readapt-affected")  # offered right after the withdrawal
    page.wait_for_selector("#readapted a")
    new_job = str(page.get_attribute("#readapted a", "href")).rsplit("/", 1)[1]
    with console_stack.api() as api:
        assert api.job(new_job).parent_id == job_id
        original = api.job(job_id)
        assert (original.used_withdrawn or 0) >= 1 and original.superseded_by == [new_job]
    admin.go(f"/jobs/{job_id}")  # the original job says its checkpoint is stale and links its re-run
    assert used in (page.text_content("#stale") or "")
    assert page.get_attribute("#reruns a", "href") == f"/ui/jobs/{new_job}"
    for button in ("#download-checkpoint", "#download-onnx", "#download-safetensors"):  # every download marked
        assert "(stale)" in (page.text_content(button) or ""), button
    assert page.locator("#readapt").count() == 0  # its re-run exists: no second readapt offered
    admin.shot(shots, "job-stale")
    admin.go("/jobs")
    assert page.locator(f"tr[data-job='{job_id}'] .stale").count() == 1
    admin.go(f"/pool/{used}")  # the re-run, as what it is: made since the withdrawal, without the item
    assert new_job[:12] in (page.text_content("#reruns") or "")
    assert "may have retrieved" not in (page.text_content("main") or "")
    assert "Withdrawn by an admin at" in (page.text_content("#withdrawn-at") or "")
    assert "never added" not in (page.text_content("main") or "")
    admin.shot(shots, "withdrawn-item")
    admin.go("/pool/search")
    page.set_input_files("#query-image", str(query))
    page.click("#search")
    page.wait_for_selector("#results li")
    assert used not in page.eval_on_selector_all("#results li", "els => els.map(e => e.dataset.id)")
    admin.go(f"/pool/{used}")
    assert "withdrawn" in (page.text_content("h1") or "") and job_id[:12] in (page.text_content("#item-lineage") or "")


def test_admin_makes_and_revokes_a_key_in_the_browser_and_the_audit_lists_it(
        admin: Console, browser: Any, console_stack: Stack, shots: Path) -> None:
    """The Keys page: a key made (shown once), signed in with in another browser context, revoked (that session
    ends at its next page); the Audit page lists the key's making and revocation, its sign-in and the withdrawal."""
    page = admin.page
    admin.go("/keys")
    page.fill("#key-team", "vision")
    page.select_option("#key-role", "read")
    page.fill("#key-name", "browser test")
    page.click("#create-key")
    page.wait_for_selector("#new-key")
    key = (page.text_content("#new-key") or "").strip()
    key_id = (page.text_content("#created-key code") or "").strip()
    assert key and key_id and page.locator(f"tr[data-key='{key_id}']").count() == 1
    admin.shot(shots, "keys")
    admin.go("/keys")
    assert key not in page.content()  # shown once
    reader = Console(browser, console_stack, key)
    assert "vision" in (reader.page.text_content("#team") or "") and reader.page.locator("#new-job").count() == 0
    page.click(f"tr[data-key='{key_id}'] button.revoke")
    page.wait_for_selector(f"tr[data-key='{key_id}']:has-text('revoked')")
    reader.go("/jobs")
    assert "/ui/login" in reader.page.url  # revoked: its session ends at once
    reader.close()
    admin.go("/audit")
    actions = page.eval_on_selector_all("#audit tr[data-action]", "els => els.map(e => e.dataset.action)")
    assert {"key.create", "key.revoke", "sign_in", "pool.withdraw", "job.readapt"} <= set(actions), actions
    targets = page.eval_on_selector_all("#audit tr[data-action^='key.'] code", "els => els.map(e => e.textContent)")
    assert key_id in targets
    refused = page.eval_on_selector_all("#audit tr[data-action='pool.withdraw']", "els => els.map(e => e.textContent)")
    assert any("refused" in r for r in refused), refused  # the user's forced withdrawal (issue 50)
    assert page.locator("#audit-filter option[value='pool.ingest']").count() == 1
    admin.shot(shots, "audit")


def test_no_console_page_answers_5xx(admin: Console, shots: Path) -> None:
    """Every console link reachable from the jobs page (downloads and forms aside), and the images they show."""
    page = admin.page
    seen: set[str] = set()
    todo = ["/jobs"]
    while todo and len(seen) < 80:
        path = todo.pop(0)
        if path in seen:
            continue
        seen.add(path)
        resp = admin.go(path)
        assert resp.status < 500, (path, resp.status)
        assert resp.status == 200 or "/withdraw" in path or path.startswith("/pool/"), (path, resp.status)
        page.wait_for_load_state("networkidle")
        for href in page.eval_on_selector_all("a[href^='/ui/']", "els => els.map(e => e.getAttribute('href'))"):
            rel = href.removeprefix("/ui")
            if not rel.split("?")[0].endswith(("/checkpoint", "/report")) and rel not in seen:
                todo.append(rel)
    assert len(seen) > 10
    bad = [s for s in admin.statuses if s[0] >= 500]
    assert not bad, bad
    admin.go("/nope")
    assert page.text_content("#error-message") and "Not found" in (page.text_content("#error-headline") or "")
    page.context.clear_cookies()
    admin.go("/jobs")
    assert "/ui/login" in page.url
    admin.shot(shots, "login")

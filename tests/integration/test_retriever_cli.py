"""`t3ar pool ...` against a real retriever, and `t3ar serve retriever` as a real process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
from click.testing import CliRunner

from t3ar.cli.pool_cmd import pool

if TYPE_CHECKING:
    from conftest import RetrieverProcess

REPO = Path(__file__).resolve().parents[2]


def _run(args: list[str], url: str, token: str = "test-admin-token") -> tuple[int, str]:
    result = CliRunner().invoke(pool, [*args, "--url", url, "--token", token])
    return result.exit_code, result.output


def test_pool_commands(retriever_module: RetrieverProcess, tmp_path: Path, make_png: Callable[..., bytes]) -> None:
    src = tmp_path / "imgs"
    (src / "sub").mkdir(parents=True)
    for i in range(6):
        (src / ("sub" if i % 2 else "") / f"{i}.png").write_bytes(make_png(200 + i))
    (src / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nbroken")
    (src / "notes.txt").write_text("ignored: not an image name")
    url = retriever_module.url

    code, out = _run(["ingest", str(src), "--source", "cli", "--batch-size", "2", "--json"], url)
    assert code == 0, out
    summary = json.loads(out[out.index("{"):])
    assert (summary["files"], summary["added"], summary["rejected"]) == (7, 6, 1)
    assert summary["rejected_items"][0]["name"] == "broken.png"
    code, out = _run(["ingest", str(src), "--source", "cli", "--json"], url)  # resumable: nothing re-sent
    again = json.loads(out[out.index("{"):])
    assert code == 0 and again["skipped_existing"] == 6 and again["added"] == 0

    archive = tmp_path / "more.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        for i in range(3):
            p = tmp_path / f"t{i}.png"
            p.write_bytes(make_png(300 + i))
            tf.add(p, arcname=f"more/t{i}.png")
    code, out = _run(["ingest", str(archive), "--source", "tar"], url)
    assert code == 0 and "3 added" in out, out

    query = src / "3.png" if (src / "3.png").exists() else src / "sub" / "3.png"
    code, out = _run(["search", str(query), "--k", "3", "--json"], url, "test-rw-token")
    hits = json.loads(out)["results"]
    assert code == 0 and len(hits) == 3 and hits[0]["score"] > 0.999
    code, out = _run(["stats", "--json"], url, "test-rw-token")
    assert code == 0 and json.loads(out)["sources"]["cli"] == 6 and json.loads(out)["sources"]["tar"] == 3
    code, out = _run(["stats"], url, "test-rw-token")
    assert code == 0 and "embedder:" in out

    # one exit for pool items: `t3ar withdraw` through the API (recorded, lineage, caches told); no `pool rm`
    code, out = _run(["rm", hits[0]["id"]], url)
    assert code == 2 and "No such command 'rm'" in out
    with retriever_module.client() as c:
        assert c.stats().count == 9
    code, out = _run(["stats"], "http://127.0.0.1:9", "x")
    assert code == 1 and "unreachable" in out


def test_pool_ingest_with_labels(retriever_module: RetrieverProcess, tmp_path: Path,
                                 make_png: Callable[..., bytes]) -> None:
    """Issue 33: ``--labels folders`` labels DIR/<class>/ images with <class> (loose ones none); ``--labels
    FILE.csv`` labels the paths it names and leaves the others unlabelled; a bad CSV stops before any upload."""
    src = tmp_path / "archive"
    for i, rel in enumerate(["owl/a.png", "owl/deep/b.png", "emu/c.png", "loose.png"]):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(make_png(400 + i))
    url = retriever_module.url
    code, out = _run(["ingest", str(src), "--source", "lab", "--labels", "folders", "--in-flight", "1"], url)
    assert code == 0 and "4 added" in out and "3 of the uploaded images carried a label" in out, out
    with retriever_module.client() as c:
        got = {it.filename: it.label for it in c.iter_items(source="lab")}
        assert got == {"owl/a.png": "owl", "owl/deep/b.png": "owl", "emu/c.png": "emu", "loose.png": None}
        assert c.list_items(label="owl", source="lab").total == 2

    flat = tmp_path / "flat"
    flat.mkdir()
    for i in range(3):
        (flat / f"{i}.png").write_bytes(make_png(420 + i))
    csv = tmp_path / "labels.csv"
    csv.write_text("path,label\n0.png,yak\n2.png,gnu\nnot-here.png,ox\n")
    code, out = _run(["ingest", str(flat), "--source", "csv", "--labels", str(csv), "--json"], url)
    summary = json.loads(out[out.index("{"):])
    assert code == 0 and summary["labelled"] == 2 and summary["csv_rows_unmatched"] == 1, out
    with retriever_module.client() as c:
        assert {it.filename: it.label for it in c.iter_items(source="csv")} == {
            "0.png": "yak", "1.png": None, "2.png": "gnu"}
    code, out = _run(["search", str(flat / "0.png"), "--k", "1"], url, "test-rw-token")
    assert code == 0 and out.strip().endswith("yak"), out

    csv.write_text("0.png,\x01\n")
    code, out = _run(["ingest", str(tmp_path / "flat"), "--source", "bad", "--labels", str(csv)], url)
    assert code == 2 and "row 1" in out, out
    code, out = _run(["ingest", str(flat), "--labels", "folder"], url)
    assert code == 2 and "folders" in out, out


def test_serve_retriever_runs_and_stops_gracefully(tmp_path: Path) -> None:
    from conftest import free_port

    port = free_port()
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'shared'}{os.pathsep}{REPO}", "T3AR_RETRIEVER_AUTH_DISABLED": "true",
           "T3AR_RETRIEVER_EMBEDDER": "none", "T3AR_RETRIEVER_VECTOR_DIM": "4", "T3AR_RETRIEVER_VECTOR_IDENTITY": "t"}
    cmd = [sys.executable, "-c", "from t3ar_services.cli.serve import serve; serve()", "retriever",
           "--data-dir", str(tmp_path / "pool"), "--port", str(port)]
    log = tmp_path / "serve.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ready").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            raise AssertionError(log.read_text())
        added = httpx.post(f"http://127.0.0.1:{port}/pool/vectors", params={"identity": "t"},
                           content=b"\x00\x00\x80?" * 8)
        assert added.status_code == 200 and len(added.json()["ids"]) == 2
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    # text log lines: logger, the request id (none at shutdown: "-"), message
    assert "t3ar_services.retriever.startup [-]: index saved (2 vectors)" in text and "retriever stopped" in text
    assert "AUTH IS DISABLED" in text
    bad = subprocess.run(cmd, env={**env, "T3AR_RETRIEVER_AUTH_DISABLED": "false"}, cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 1 and "invalid retriever settings" in bad.stderr and "T3AR_RETRIEVER_TOKEN" in bad.stderr

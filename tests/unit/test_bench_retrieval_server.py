"""The real Milvus server's column of `t3ar bench retrieval` (issue 34): kept in ``backends["milvus-server"]``
with when and how it was measured, carried by later runs given no server, rendered once in retrieval.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from t3ar_bench.retrieval import main, report
from t3ar_bench.retrieval.backends import SERVER_KEY, keep_server_column, server_column

ROOT = Path(__file__).resolve().parents[2]


def _side(qps: float) -> dict[str, Any]:
    return {"start_s": 1.0, "ingest_vectors_per_s": 1000.0, "qps": qps,
            "single": {"p50_ms": 5.0, "p99_ms": 9.0, "max_ms": 9.5, "n": 10},
            "delete": {"p50_ms": 3.0, "p99_ms": 8.0, "max_ms": 8.0, "n": 10}, "deleted_returned_after_2xx": 0}


def _section(server: dict[str, Any] | None) -> dict[str, Any]:
    return {"vectors": 1000, "dim": 512, "k": 50, "batch": 256, "milvus_uri": "milvus-lite", "same_top1_share": 1.0,
            "faiss": _side(50.0), "milvus": _side(40.0), "milvus_server_version": "v2.3.5",
            "milvus_server": server or {"skipped": "no Milvus server was given"}}


def test_a_run_without_a_server_carries_the_last_one() -> None:
    measured = _section(_side(7.0))
    keep_server_column(measured, {}, measured_at="2026-11-26 10:00:00", command="t3ar bench retrieval --milvus-uri URI")
    own = measured[SERVER_KEY]
    assert own["qps"] == 7.0 and own["deleted_returned_after_2xx"] == 0 and not own["carried_over"]
    assert own["measured_at"] == "2026-11-26 10:00:00" and own["vectors"] == 1000

    later = _section(None)
    keep_server_column(later, {"backends": measured}, measured_at="2026-11-27 10:00:00", command="t3ar bench retrieval")
    assert later[SERVER_KEY] == {**own, "carried_over": True}  # when and how stay those of the measuring run

    again = _section(_side(9.0))  # a run that measures a server replaces the kept one
    keep_server_column(again, {"backends": later}, measured_at="2026-11-28 10:00:00", command="c")
    assert again[SERVER_KEY]["qps"] == 9.0 and again[SERVER_KEY]["measured_at"] == "2026-11-28 10:00:00"

    nothing = _section(None)
    keep_server_column(nothing, {}, measured_at="x", command="c")
    assert SERVER_KEY not in nothing


def test_a_separate_backends_run_is_carried_when_the_full_run_has_no_key() -> None:
    sep = {**_section(_side(7.0)), "measured_at": "2026-11-26 11:00:00", "command": "t3ar bench retrieval --only "
           "backends --milvus-uri URI", "load_average_start": [0.9, 1.0, 1.0]}
    later = _section(None)
    keep_server_column(later, {"backends": _section(None), "backends_separate": sep}, measured_at="y", command="c")
    assert later[SERVER_KEY]["measured_at"] == "2026-11-26 11:00:00" and later[SERVER_KEY]["carried_over"]
    assert later[SERVER_KEY]["command"] == sep["command"]


def test_the_committed_results_keep_the_server_column() -> None:
    committed = json.loads((ROOT / "docs" / "benchmarks" / "retrieval.json").read_text())
    column = committed["backends"][SERVER_KEY]
    assert column["deleted_returned_after_2xx"] == 0
    assert {"ingest_vectors_per_s", "qps", "single", "delete", "measured_at", "command", "commit"} <= set(column)
    later = _section(None)
    keep_server_column(later, committed, measured_at="z", command="t3ar bench retrieval")
    assert later[SERVER_KEY] == {**column, "carried_over": True}


def test_the_report_shows_a_carried_column_once() -> None:
    b = _section(None)
    b[SERVER_KEY] = server_column(_section(_side(7.0)), measured_at="2026-11-26 10:00:00", command="cmd",
                                  carried_over=True)
    text = "\n".join(report._backends({"backends": b}))
    assert "### The last real Milvus server measured (not in this run)" in text
    assert "| | Milvus server v2.3.5 |" in text and "| search QPS, batches of 256 | 7 |" in text
    assert "Measured on 2026-11-26 10:00:00 by `cmd` (1,000 vectors)" in text
    # the separate run's own table already shows that measurement: not twice
    sep = {**_section(_side(7.0)), "measured_at": "2026-11-26 10:00:00", "command": "cmd",
           "load_average_start": [0.5, 0.5, 0.5], "wall_seconds": 60.0}
    text = "\n".join(report._backends({"backends": b, "backends_separate": sep, "machine": {"cpus": 2}}))
    assert "not in this run" not in text and text.count("| 7 |") == 1


def test_only_backends_puts_the_server_column_into_the_full_runs_table(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # the run sets it for its children; not for other tests
    (tmp_path / "retrieval.json").write_text(json.dumps({"search": {"n": 1}, "backends": _section(None)}))
    monkeypatch.setattr(main, "_backends_section", lambda work, n, quick, uri, lite=True: _section(_side(7.0)))
    monkeypatch.setattr(report, "render_markdown", lambda r: "rendered\n")
    main.run_backends_only(tmp_path, quick=True, backends_vectors=None, milvus_uri="http://127.0.0.1:19530")
    saved = json.loads((tmp_path / "retrieval.json").read_text())
    column = saved["backends"][SERVER_KEY]
    assert column["qps"] == 7.0 and column["carried_over"]
    assert column["measured_at"] == saved["backends_separate"]["measured_at"]
    assert column["command"] == "t3ar bench retrieval --only backends --quick --milvus-uri URI"
    assert "qps" not in saved["backends"]["milvus_server"]  # the full run's own figures are left as they were


def test_a_backends_run_names_the_commit_it_measured() -> None:
    import re

    from t3ar_bench.retrieval.main import code_commit

    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?|unknown", code_commit())

"""`t3ar pool ingest --in-flight`: with one request in flight the retriever commits batches in file order.

The retriever skips near-duplicates of items already committed, so the commit order decides which of two
near-identical images stays in the pool. A fake client (no service) stands in for the retriever: the first
batch is slow, as under load, and waits briefly for a second request to arrive.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from t3ar.cli import pool_cmd
from t3ar.clients.retriever_models import AddResponse


class _FakeClient:
    def __init__(self) -> None:
        self.commits: list[list[str]] = []  # names per committed request, in commit order
        self.active = 0
        self.max_active = 0
        self.second_arrived = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, url: str, token: str | None) -> _FakeClient:
        return self

    def __enter__(self) -> _FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def exists(self, shas: list[str]) -> set[str]:
        return set()

    def add_images(self, items: list[tuple[str, bytes]], *, source: str, metadata: dict[str, Any],
                   label: str | None = None) -> AddResponse:
        names = [n for n, _ in items]
        with self.lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            first = not self.commits and names[0] == "a0.png"
            if not first:
                self.second_arrived.set()
        if first:  # the first batch is slow (decode/embed under load) while a second one may overtake it
            self.second_arrived.wait(timeout=1.0)
        with self.lock:
            self.commits.append(names)
            self.active -= 1
        return AddResponse.model_validate({"added": len(items), "exists": 0, "duplicates": 0, "rejected": 0,
                                           "items": [{"name": n, "status": "added"} for n in names]})


def _ingest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *extra: str) -> _FakeClient:
    src = tmp_path / "pool"
    src.mkdir(exist_ok=True)
    for i in range(6):
        (src / f"a{i}.png").write_bytes(b"png %d" % i)  # never decoded by the fake client
    fake = _FakeClient()
    monkeypatch.setattr(pool_cmd, "RetrieverClient", fake)
    result = CliRunner().invoke(pool_cmd.pool, ["ingest", str(src), "--batch-size", "2", "--json",
                                                "--url", "http://fake", *extra])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output[result.output.index("{"):])["added"] == 6
    return fake


def test_one_in_flight_commits_batches_in_file_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _ingest(tmp_path, monkeypatch, "--in-flight", "1")
    assert fake.max_active == 1
    assert fake.commits == [["a0.png", "a1.png"], ["a2.png", "a3.png"], ["a4.png", "a5.png"]]


def test_demo_ingests_with_one_request_in_flight() -> None:
    demo = (Path(__file__).resolve().parents[2] / "scripts" / "demo.sh").read_text()
    ingest = [line for line in demo.splitlines() if "pool ingest" in line and not line.lstrip().startswith("#")]
    assert ingest and all("--in-flight 1" in line for line in ingest)

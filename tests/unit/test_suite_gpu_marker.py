"""The suite's `gpu` skip (tests/conftest.py) follows the marker, not the word "gpu" among an item's keywords
(which hold its folders' names too: a checkout in a folder named gpu used to skip every test)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest


class _Item:
    """What the hook reads of a collected item."""

    def __init__(self, keywords: set[str], marked: bool) -> None:
        self.keywords = keywords
        self.marked = marked
        self.added: list[Any] = []

    def get_closest_marker(self, name: str) -> object | None:
        return object() if self.marked and name == "gpu" else None

    def add_marker(self, marker: Any) -> None:
        self.added.append(marker)


def test_only_gpu_marked_items_are_skipped_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.spec_from_file_location("suite_conftest", Path(__file__).parents[1] / "conftest.py")
    assert spec is not None and spec.loader is not None
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    monkeypatch.setattr(conftest.torch.cuda, "is_available", lambda: False)
    in_gpu_folder = _Item({"test_x", "unit", "tests", "gpu"}, marked=False)
    marked = _Item({"test_y", "unit", "tests", "gpu"}, marked=True)
    no_lane = SimpleNamespace(getoption=lambda name: None)  # the whole suite (no --lane)
    conftest.pytest_collection_modifyitems(no_lane, [in_gpu_folder, marked])
    assert in_gpu_folder.added == []
    assert [m.name for m in marked.added] == ["skip"]

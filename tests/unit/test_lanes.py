"""The test command's two lanes (tests/lanes.py, pytest --lane): each test in exactly one, the waiting ones in
lane 2, and each lane's children pick ports from their own half of free_port's range."""

import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest
from lanes import HERE, LANES, lane_ports, split

from t3ar import ports


def _item(rel: str, *markers: str) -> Any:
    return SimpleNamespace(path=HERE / rel, get_closest_marker=lambda name: object() if name in markers else None)


def test_the_waiting_tests_are_lane_2_and_the_rest_lane_1() -> None:
    items = [_item("unit/test_lanes.py"), _item("e2e/test_stack_cli.py"), _item("integration/test_fuzz_openapi.py"),
             _item("integration/test_retriever_api.py"), _item("integration/test_real_data.py", "slow"),
             _item("integration/test_retriever_api.py", "milvus_server"), _item("integration/test_cli_core.py")]
    lanes = split(items)
    # a file with one milvus_server test goes whole to lane 2 (its module fixtures start once); order is kept
    assert lanes[2] == items[1:4] + [items[5]]
    assert lanes[1] == [items[0], items[4], items[6]]


def test_a_lane_runs_its_own_tests_and_deselects_the_others() -> None:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "--lane",
                          "2", "tests/e2e/test_stack_cli.py", "tests/unit/test_api_stack_plan.py"],
                         cwd=HERE.parent, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    nodes = [line for line in out.stdout.splitlines() if "::" in line]
    cli_tests = (HERE / "e2e" / "test_stack_cli.py").read_text().count("\ndef test_")
    assert len(nodes) >= cli_tests > 0 and all(n.startswith("tests/e2e/test_stack_cli.py::") for n in nodes)
    plan_tests = (HERE / "unit" / "test_api_stack_plan.py").read_text().count("\ndef test_")
    assert f"{plan_tests} deselected" in out.stdout


def test_each_lane_takes_its_own_part_of_the_port_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ports.RANGE_ENV, raising=False)
    first, stop = ports.port_range()
    parts = [tuple(int(x) for x in lane_ports(lane).split("-")) for lane in LANES]
    assert parts[0][0] == first and parts[0][1] == parts[1][0] and parts[1][1] <= stop
    assert all(hi - lo >= 1000 for lo, hi in parts)  # room enough for free_port's random picks
    for lo, hi in parts:
        monkeypatch.setenv(ports.RANGE_ENV, f"{lo}-{hi}")
        assert lo <= ports.free_port() < hi

"""The suite's two lanes (``pytest --lane 1|2``; scripts/test.sh runs them side by side, docs/development.md says
why): which lane a test is in, and each lane's part of free_port's port range. A module of its own, not the
conftest: test modules import it by name (three conftest modules share that name)."""

from pathlib import Path

import pytest

from t3ar import ports

#: the test files of lane 2 besides the end-to-end folder and the files with a test marked ``milvus_server``
LANE_2_FILES = ("integration/test_fuzz_openapi.py",)
LANES = (1, 2)
HERE = Path(__file__).resolve().parent


def _rel(item: pytest.Item) -> str:
    return Path(str(item.path)).resolve().relative_to(HERE).as_posix()


def split(items: list[pytest.Item]) -> dict[int, list[pytest.Item]]:
    """The items of each lane, in their order. Lane 2: the tests that mostly wait on other processes: the
    end-to-end folder (the embedded stack's jobs), every file with a test marked ``milvus_server`` (the real
    server's starts and kills; whole files, so that their module fixtures start in one lane), the OpenAPI fuzzers
    (the services they drive): about half the suite's time. Lane 1: the rest, mostly the CPU in this process.
    Session resources stay in one lane: the stack (lane 2), the Milvus server (lane 2: one per machine, its etcd
    binds a fixed port), the data kit's package cache (lane 1: the real-data tests)."""
    server_files = {_rel(item) for item in items if item.get_closest_marker("milvus_server") is not None}
    lanes: dict[int, list[pytest.Item]] = {lane: [] for lane in LANES}
    for item in items:
        rel = _rel(item)
        lanes[2 if rel.startswith("e2e/") or rel in LANE_2_FILES or rel in server_files else 1].append(item)
    return lanes


def lane_ports(lane: int) -> str:
    """``lane``'s part of free_port's range ($T3AR_FREE_PORT_RANGE's form): the lanes' parts do not overlap."""
    first, stop = ports.port_range()
    part = (stop - first) // len(LANES)
    lo = first + (lane - 1) * part
    return f"{lo}-{lo + part}"

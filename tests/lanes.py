"""The suite's two lanes (``pytest --lane 1|2``; scripts/test.sh runs them side by side, docs/development.md says
why): which lane a test is in, and each lane's part of free_port's port range. A module of its own, not the
conftest: test modules import it by name (three conftest modules share that name)."""

from pathlib import Path

import pytest

from t3ar import ports

#: the test files of lane 2 besides the end-to-end folder and the tests marked ``milvus_server``
LANE_2_FILES = ("integration/test_fuzz_openapi.py",)
LANES = (1, 2)
HERE = Path(__file__).resolve().parent


def lane_of(item: pytest.Item) -> int:
    """2: the tests that mostly wait on other processes (the embedded stack's jobs, the real Milvus server's
    starts and kills, the OpenAPI fuzzers' services), about half the suite's time; 1: the rest (mostly the CPU
    in this process). Whole session fixtures stay in one lane: the stack (e2e), the Milvus server (one per
    machine: its etcd binds a fixed port), the data kit's package cache (real data, lane 1)."""
    rel = Path(str(item.path)).resolve().relative_to(HERE).as_posix()
    if rel.startswith("e2e/") or rel in LANE_2_FILES or item.get_closest_marker("milvus_server") is not None:
        return 2
    return 1


def lane_ports(lane: int) -> str:
    """``lane``'s part of free_port's range ($T3AR_FREE_PORT_RANGE's form): the lanes' parts do not overlap."""
    first, stop = ports.port_range()
    part = (stop - first) // len(LANES)
    lo = first + (lane - 1) * part
    return f"{lo}-{lo + part}"

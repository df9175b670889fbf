"""Suite-wide hooks: `gpu` tests are skipped (not failed) on machines without CUDA; ``--lane`` runs one of the suite's
two lanes (scripts/test.sh runs them side by side, docs/development.md says why)."""

import os
from pathlib import Path

import pytest
import torch

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


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--lane", type=int, choices=LANES, default=None,
                     help="run only this lane of the suite (1 or 2; tests/conftest.py says which tests): the test "
                          "command runs both side by side")


def lane_ports(lane: int) -> str:
    """``lane``'s part of free_port's range ($T3AR_FREE_PORT_RANGE's form): the lanes' parts do not overlap."""
    first, stop = ports.port_range()
    part = (stop - first) // len(LANES)
    lo = first + (lane - 1) * part
    return f"{lo}-{lo + part}"


def pytest_configure(config: pytest.Config) -> None:
    lane = config.getoption("--lane")
    if lane is not None and not os.environ.get(ports.RANGE_ENV):
        # this process and its children pick ports from the lane's own part: two lanes never pick the same one
        os.environ[ports.RANGE_ENV] = lane_ports(lane)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    lane = config.getoption("--lane")
    if lane is not None:
        chosen = [item for item in items if lane_of(item) == lane]
        config.hook.pytest_deselected(items=[item for item in items if lane_of(item) != lane])
        items[:] = chosen
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        # the marker, not ``"gpu" in item.keywords``: keywords hold the names of the item's folders too, so a
        # checkout in a folder named gpu skipped every test
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)

"""Suite-wide hooks: `gpu` tests are skipped (not failed) on machines without CUDA; ``--lane`` runs one of the suite's
two lanes (scripts/test.sh runs them side by side, docs/development.md says why); each test gets back the umask it
started with (a service's app made in-process sets the process's umask to 077: services/common/private.py)."""

import os
from collections.abc import Iterator

import pytest
import torch
from lanes import LANES, lane_ports, split

from t3ar import ports


@pytest.fixture(autouse=True)
def _umask_kept() -> Iterator[None]:
    old = os.umask(0o022)
    os.umask(old)
    yield
    os.umask(old)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--lane", type=int, choices=LANES, default=None,
                     help="run only this lane of the suite (1 or 2; tests/lanes.py says which tests): the test "
                          "command runs both side by side")


def pytest_configure(config: pytest.Config) -> None:
    lane = config.getoption("--lane")
    if lane is not None:
        # this process and its children pick ports from the lane's own part of the range (the default one, or
        # the one given): two lanes never pick the same port
        os.environ[ports.RANGE_ENV] = lane_ports(lane)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    lane = config.getoption("--lane")
    if lane is not None:
        lanes = split(items)
        config.hook.pytest_deselected(items=[item for other in LANES if other != lane for item in lanes[other]])
        items[:] = lanes[lane]
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        # the marker, not ``"gpu" in item.keywords``: keywords hold the names of the item's folders too, so a
        # checkout in a folder named gpu skipped every test
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _umask_restored() -> object:
    """Each test leaves the process's umask as it found it: a service's ``create_app`` sets 077 for its process
    (t3ar_services.common.private), and in a test that process is pytest's, where a later test that builds files
    for another tool (a .deb's 0755 control folder, for one) would inherit it."""
    mask = os.umask(0o022)
    os.umask(mask)
    yield
    os.umask(mask)

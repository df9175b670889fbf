"""Suite-wide hooks: `gpu` tests are skipped (not failed) on machines without CUDA."""

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        # the marker, not ``"gpu" in item.keywords``: keywords hold the names of the item's folders too, so a
        # checkout in a folder named gpu skipped every test
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)

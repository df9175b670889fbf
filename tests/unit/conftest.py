"""Fixtures the web console's tests share (``test_console_*.py``): the mocked retriever's pool and an API app with
the console on it (:mod:`console_kit`). A module that defines its own ``pool`` or ``client`` uses that one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from fastapi.testclient import TestClient


@pytest.fixture()
def pool() -> dict[str, Any]:
    from console_kit import new_pool  # imported here: the other unit tests do not load the API app

    return new_pool()


@pytest.fixture()
def client(tmp_path: Path, pool: dict[str, Any]) -> Iterator[TestClient]:
    from console_kit import console_client

    yield from console_client(tmp_path, pool)

"""A method registered for a test whose option is refused at train time: no product option is (the ones that were,
``reliable_entropy`` and ``collapse_fallback``, are the benchmarks' probe switches now), and the API's tests still
show that the mode an archive decides is validated with the config, once, before anything is stored."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from pydantic import model_validator

from t3ar.method import registry
from t3ar.method.config import OptimiserConfig
from t3ar.method.registry import MethodSpec

NAME = "test-watch"


class WatchConfig(OptimiserConfig):
    method: Literal["test-watch"] = "test-watch"
    watch: bool = False  # a test-time option: refused at train time

    @model_validator(mode="after")
    def _test_time(self) -> WatchConfig:
        if self.watch and self.mode == "train":
            raise ValueError("watch is a test-time option (mode 'test')")
        return self


@contextmanager
def mode_bound_method() -> Iterator[str]:
    """Register :data:`NAME` (a train-time method whose ``watch`` is refused at train time) for the block."""
    registry.register(MethodSpec(NAME, "a test method", step="t3ar.method.tent:Tent", config=WatchConfig))
    try:
        yield NAME
    finally:
        registry.unregister(NAME)

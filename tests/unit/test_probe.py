"""The benchmarks' controls reach the method through one argument, ``adapt(probe=...)`` (t3ar.method.probe),
that the product never sets; a probe that does not fit the run is refused before anything trains."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
from tiny_models import tiny_problem

from t3ar.method.adapt import adapt
from t3ar.method.base import MethodSetup
from t3ar.method.config import AdaptConfig
from t3ar.method.probe import Probe


def test_the_benchmark_controls_are_one_optional_argument() -> None:
    params = inspect.signature(adapt).parameters
    assert params["probe"].default is None
    assert not {"diagnostic_labels", "diagnostics", "pool_diagnostic_labels", "pool_label_oracle",
                "pool_label_draw"} & set(params)
    fields = {f.name: f for f in dataclasses.fields(MethodSetup)}
    assert fields["probe"].default == Probe()
    assert not {"diagnostics", "pool_labels", "pool_oracle", "pool_label_draw"} & set(fields)


@pytest.mark.parametrize(("probe", "match"), [
    (Probe(diagnostic_labels=torch.zeros(3, dtype=torch.long)), r"diagnostic_labels must be \[N=12\]"),
    (Probe(pool_diagnostic_labels=torch.zeros(2, dtype=torch.long)), r"pool_diagnostic_labels must be \[P=9\]"),
    (Probe(pool_label_oracle=True), "pool_label_oracle needs pool_diagnostic_labels"),
    (Probe(pool_label_draw="random"), "pool_label_draw='random' needs pool_labels and pool_labels.weight > 0"),
])
def test_a_probe_that_does_not_fit_the_run_is_refused(probe: Probe, match: str) -> None:
    model, target, pool, nbr = tiny_problem()
    before = [p.detach().clone() for p in model.parameters()]
    cfg = AdaptConfig(method="t3ar", k=3, epochs=1, batch_size=4, bank_size=64, train_groups=None)
    with pytest.raises(ValueError, match=match):
        adapt(model, target, cfg, mean=(0.5,) * 3, std=(0.5,) * 3, neighbours=nbr, pool_images=pool,
              device=torch.device("cpu"), probe=probe)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))

"""The method registry: each method declared once, its properties what the config, job sizing and the loop read,
each adapting method behind the one interface; the declarations free of torch."""

import subprocess
import sys
from pathlib import Path

import pytest

from t3ar.jobsize import memory_bytes, planned_steps
from t3ar.method import config as method_config
from t3ar.method import registry
from t3ar.method.base import MethodStep
from t3ar.method.config import AdaptConfig, OptimiserConfig, adapt_config, config_class
from t3ar.method.presets import with_default
from t3ar.method.registry import MethodSpec

ROOT = Path(__file__).resolve().parents[2]


def test_the_built_in_methods_and_their_properties() -> None:
    assert sorted(registry.names()) == sorted(["source", "bn-adapt", "tent", "shot-im", "adacontrast",
                                               "t3ar-noretrieval", "t3ar-random", "t3ar", "sar", "eata"])
    assert sorted(registry.family()) == ["t3ar", "t3ar-noretrieval", "t3ar-random"]
    retrieval = {n: registry.get(n).retrieval for n in registry.names() if registry.get(n).retrieval}
    assert retrieval == {"t3ar": "nearest", "t3ar-random": "random"}
    assert sorted(n for n in registry.names() if not registry.get(n).train_mode) == ["adacontrast", "bn-adapt", "eata",
                                                                                      "sar"]
    assert sorted(n for n in registry.names() if not registry.get(n).optimises) == ["bn-adapt", "source"]
    assert [n for n in registry.names() if registry.get(n).bn_statistics] == ["bn-adapt"]
    assert adapt_config(method="adacontrast").resolved_diversity_weight == 1.0
    assert "diversity_weight" not in method_config.config_class("tent").flat_fields()  # tent has no diversity term


@pytest.mark.parametrize("method", registry.names())
def test_every_adapting_method_implements_the_interface(method: str) -> None:
    spec = registry.get(method)
    impl = spec.step_class()
    if spec.optimises:
        assert impl is not None and issubclass(impl, MethodStep)
    else:  # no step: the model as it is / its BatchNorm statistics
        assert impl is None
    assert adapt_config(method=method).spec is spec  # a valid config for it exists
    assert type(adapt_config(method=method)) is method_config.config_class(method)


def test_an_unknown_method_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown method 'nope': one of .*t3ar-random"):
        adapt_config(method="nope")
    schema = AdaptConfig.model_json_schema()  # the union of the registered configs, discriminated on method
    assert sorted(schema["discriminator"]["mapping"]) == sorted(registry.names())


def test_a_name_is_registered_once() -> None:
    registry.register(registry.get("tent"))  # the same declaration again (a module imported twice): no-op
    with pytest.raises(ValueError, match="already registered"):
        registry.register(MethodSpec("tent", "another tent", step="elsewhere:Tent"))
    with pytest.raises(ValueError, match="non-empty"):
        registry.register(MethodSpec(" ", "no name"))


def test_job_sizing_reads_the_config() -> None:
    for name in registry.names():
        accepted = config_class(name).flat_fields()
        cfg = adapt_config(method=name, **{k: v for k, v in {"epochs": 2, "batch_size": 4}.items() if k in accepted})
        assert planned_steps(cfg, 12) == (6 if cfg.spec.optimises else 0), name
        bank = cfg.bank_entries
        assert (bank > 0) == (name in ("adacontrast", *registry.family())), name
        if bank:
            smaller = adapt_config(**{**cfg.flat(), "bank_size": 8})
            assert memory_bytes(cfg, 12, 8, 16, 3) > memory_bytes(smaller, 12, 8, 16, 3)
        # the benchmarks' redraw (a probe switch, never a job's) holds every one of the r*k candidates' images
        k_r = (cfg.retrieval_options.k * cfg.retrieval_options.r) if cfg.retrieval_options is not None else 0
        assert (memory_bytes(cfg, 12, 8, 16, 3, redraw_neighbours=True) - memory_bytes(cfg, 12, 8, 16, 3)
                == (12 * (k_r - cfg.retrieval_options.k) * 3 * 8 * 8 if cfg.retrieval_options is not None else 0)), name
    # the family's second stage adds its steps to the budget, given flat or nested
    for name in registry.family():
        assert planned_steps(adapt_config(method=name, epochs=2, batch_size=4, second_stage_steps=40), 12) == 46
        assert planned_steps(adapt_config(method=name, epochs=2, batch_size=4, second_stage={"steps": 40}), 12) == 46


def test_the_family_config_nests_its_groups_and_parses_flat_input() -> None:
    cfg = adapt_config(method="t3ar", k=3, pool_label_weight=1.0, second_stage={"steps": 4}, refine_neighbors=5)
    assert sorted(cfg.groups()) == sorted(["retrieval", "pool_data", "pool_labels", "refinement", "second_stage",
                                           "safeguards"])
    dumped = cfg.model_dump()
    assert dumped["retrieval"]["k"] == 3 and dumped["pool_labels"]["weight"] == 1
    assert dumped["second_stage"]["steps"] == 4
    assert "k" not in dumped and "pool_label_weight" not in dumped  # the canonical form is the nested one
    assert (cfg.retrieval.k, cfg.pool_labels.weight, cfg.second_stage.steps, cfg.refinement.neighbors) == (3, 1, 4, 5)
    for flat in ("k", "pool_label_weight", "second_stage_steps", "refine_neighbors"):  # one name per option
        assert not hasattr(cfg, flat)
    assert AdaptConfig.model_validate(dumped) == cfg == adapt_config(**cfg.flat())  # both forms, the same config
    assert adapt_config(method="t3ar", second_stage_steps=9, second_stage={"steps": 4}).second_stage.steps == 4


def test_a_field_of_another_method_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="second_stage_steps, knn_refine are options of the T3AR family .*, not of "
                                         "tent"):
        adapt_config(method="tent", second_stage_steps=3, knn_refine=True)
    with pytest.raises(ValueError, match="k is an option of the T3AR family .*, not of tent"):
        adapt_config(method="tent", k=3)  # accepted and ignored before: now refused, even at its default
    with pytest.raises(ValueError, match="ema is an option of adacontrast, not of t3ar"):
        adapt_config(method="t3ar", ema=0.9)
    with pytest.raises(ValueError, match="nope is not an option of tent"):
        adapt_config(method="tent", nope=1)


def test_a_method_registers_its_config_class_with_a_group() -> None:
    from typing import Literal

    from pydantic import Field, model_validator

    from t3ar.method.config import Options

    class Extra(Options):
        steps: int = Field(default=0, ge=0)
        lr: float | None = None

        @model_validator(mode="after")
        def _check(self) -> "Extra":
            if self.lr is not None and not self.steps:
                raise ValueError("grouped: extra.lr needs extra.steps")
            return self

        def added_steps(self) -> int:
            return self.steps

    class GroupedConfig(OptimiserConfig):
        method: Literal["grouped"] = "grouped"
        extra: Extra = Extra()

    with pytest.raises(ValueError, match="Literal naming 'other'"):
        registry.register(MethodSpec("other", "misnamed", step="t3ar.method.tent:Tent", config=GroupedConfig))
    registry.register(MethodSpec("grouped", "tent with a group", step="t3ar.method.tent:Tent", config=GroupedConfig))
    try:
        cfg = adapt_config(method="grouped", epochs=2, batch_size=4, extra={"steps": 7})
        assert type(cfg) is GroupedConfig and planned_steps(cfg, 12) == 6 + 7
        with pytest.raises(ValueError, match="grouped: extra.lr needs extra.steps"):
            adapt_config(method="grouped", extra={"lr": 0.1})
        with pytest.raises(ValueError, match="extra is an option of grouped, not of tent"):
            adapt_config(method="tent", extra={"steps": 1})
    finally:
        registry.unregister("grouped")
    with pytest.raises(ValueError, match="unknown method 'grouped'"):
        adapt_config(method="grouped")


def test_a_config_is_validated_once() -> None:
    """``adapt_config(**fields)`` builds the method's class through the union, validating once (as does any other
    way of building a config); ``AdaptConfig(...)`` itself is refused: no constructor returns another class."""
    from typing import Literal

    from pydantic import model_validator

    runs: list[int] = []

    class CountedConfig(OptimiserConfig):
        method: Literal["counted"] = "counted"

        @model_validator(mode="after")
        def _count(self) -> "CountedConfig":
            runs.append(self.epochs)
            return self

    registry.register(MethodSpec("counted", "tent, its validations counted", step="t3ar.method.tent:Tent",
                                 config=CountedConfig))
    try:
        built = [adapt_config(method="counted", epochs=2), AdaptConfig.model_validate({"method": "counted",
                                                                                       "epochs": 3}),
                 CountedConfig(epochs=4), CountedConfig.model_validate({"epochs": 5})]
        assert [type(c) for c in built] == [CountedConfig] * 4 and [c.epochs for c in built] == [2, 3, 4, 5]
        assert runs == [2, 3, 4, 5]  # once each
        with pytest.raises(TypeError):
            adapt_config({"method": "counted"})  # type: ignore[call-arg]  # fields by name only, as before
        with pytest.raises(TypeError, match="AdaptConfig is the union"):
            AdaptConfig(method="counted")
    finally:
        registry.unregister("counted")


def test_the_config_layer_does_not_import_torch() -> None:
    """The services and the CLI validate configs, size jobs and list the methods without loading torch."""
    code = ("import sys; from t3ar.method.config import AdaptConfig, adapt_config; from t3ar.method import registry; "
            "from t3ar.jobsize import planned_steps; "
            "[planned_steps(adapt_config(method=n), 10) for n in registry.names()]; "
            "AdaptConfig.model_json_schema(); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT / "shared")})
    assert out.stdout.strip() == "False", out.stderr


def test_each_method_takes_only_the_options_it_reads() -> None:
    """``source`` reads no batch or schedule, ``bn-adapt`` only its batch and layers, ``t3ar-noretrieval`` no pool
    option (not even the default preset's pool label weight): an option a method ignores is refused, naming it."""
    for name, option in [("source", {"lr": 0.01}), ("source", {"batch_size": 8}), ("source", {"train_groups": 1}),
                         ("bn-adapt", {"lr": 0.01}), ("bn-adapt", {"epochs": 2}), ("bn-adapt", {"amp": False}),
                         ("t3ar-noretrieval", {"k": 3}), ("t3ar-noretrieval", {"pool_data_weight": 1.0}),
                         ("t3ar-noretrieval", {"retrieval": {"k": 3}}), ("t3ar-noretrieval", {"pool_labels": {}}),
                         # the entropy methods train the norm layers' affine parameters alone
                         ("tent", {"train_groups": 1}), ("sar", {"train_groups": None}),
                         ("eata", {"train_groups": 2})]:
        with pytest.raises(ValueError, match=f"not of {name}") as e:
            adapt_config(method=name, **option)
        assert next(iter(option)) in str(e.value), (name, option)
    assert set(config_class("source").model_fields) == {"method", "mode", "fraction", "seed"}
    assert set(config_class("bn-adapt").model_fields) == {"method", "mode", "fraction", "seed", "batch_size",
                                                           "train_groups"}
    assert adapt_config(method="bn-adapt", batch_size=8, train_groups=None).batch_size == 8
    for name in ("tent", "sar", "eata"):
        assert "train_groups" not in config_class(name).model_fields and "lr" in config_class(name).model_fields
    assert method_config.train_groups(adapt_config(method="shot-im", train_groups=1)) == 1  # ...others keep it
    with pytest.raises(TypeError, match="tent has no train_groups"):
        method_config.train_groups(method_config.trained(adapt_config(method="tent")))
    from t3ar.acceptance_options import candidate_config  # an acceptance candidate takes the shared options it has
    tent = candidate_config(adapt_config(method="t3ar", train_groups=1, lr=0.01), "tent")
    assert tent.method == "tent" and method_config.trained(tent).lr == 0.01 and "train_groups" not in tent.model_dump()
    nr = adapt_config(**with_default({"method": "t3ar-noretrieval"}))  # the validated preset, less its pool option
    assert nr.preset == "validated" and nr.second_stage.steps == 10 and "pool_labels" not in nr.model_dump()
    assert nr.retrieval_options is None and not nr.pool_as_data
    with pytest.raises(ValueError, match="t3ar-noretrieval reads no pool"):
        adapt_config(method="t3ar-noretrieval", knn_refine=True, knn_refine_labelled=True)
    assert adapt_config(**with_default({"method": "t3ar"})).pool_labels.weight == 2.0  # the preset's, with a pool

"""The method registry: each method declared once, its properties what the config, job sizing and the loop read,
each adapting method behind the one interface; the declarations free of torch."""

import subprocess
import sys
from pathlib import Path

import pytest

from t3ar.jobsize import memory_bytes, planned_steps
from t3ar.method import registry
from t3ar.method.base import MethodStep
from t3ar.method.config import AdaptConfig
from t3ar.method.registry import MethodSpec, OptionGroup

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
    assert AdaptConfig(method="adacontrast").resolved_diversity_weight == 1.0
    assert AdaptConfig(method="tent").resolved_diversity_weight == 0.0


@pytest.mark.parametrize("method", registry.names())
def test_every_adapting_method_implements_the_interface(method: str) -> None:
    spec = registry.get(method)
    impl = spec.step_class()
    if spec.optimises:
        assert impl is not None and issubclass(impl, MethodStep)
    else:  # no step: the model as it is / its BatchNorm statistics
        assert impl is None
    assert AdaptConfig(method=method, k=1).spec is spec  # a valid config for it exists


def test_an_unknown_method_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown method 'nope': one of .*t3ar-random"):
        AdaptConfig(method="nope")
    assert AdaptConfig.model_json_schema()["properties"]["method"]["enum"] == list(registry.names())


def test_a_name_is_registered_once() -> None:
    registry.register(registry.get("tent"))  # the same declaration again (a module imported twice): no-op
    with pytest.raises(ValueError, match="already registered"):
        registry.register(MethodSpec("tent", "another tent", step="elsewhere:Tent"))
    with pytest.raises(ValueError, match="non-empty"):
        registry.register(MethodSpec(" ", "no name"))


def test_job_sizing_reads_the_spec() -> None:
    for name in registry.names():
        cfg = AdaptConfig(method=name, k=2, epochs=2, batch_size=4)
        assert planned_steps(cfg, 12) == (6 if cfg.spec.optimises else 0), name
        bank = memory_bytes(cfg, 12, 8, 16, 3) - memory_bytes(cfg.model_copy(update={"bank_size": 8}), 12, 8, 16, 3)
        assert (bank > 0) == cfg.spec.bank, name
    # the family's second stage adds its steps to the budget
    for name in registry.family():
        assert planned_steps(AdaptConfig(method=name, k=2, epochs=2, batch_size=4, second_stage_steps=40), 12) == 46


def test_the_family_groups_name_its_fields_and_own_what_other_methods_refuse() -> None:
    groups = registry.get("t3ar").groups
    assert [g.name for g in groups] == ["retrieval", "pool data", "pool labels", "BatchNorm", "teacher", "refinement",
                                        "second stage", "reliable samples", "anchor", "collapse fallback",
                                        "interpolation"]
    for group in groups:
        assert set(group.own) <= set(group.fields) <= set(AdaptConfig.model_fields), group.name
        assert not any(getattr(AdaptConfig(), f) for f in group.own), group.name  # owned options are off by default
    assert set(registry.owned_options()) == {"bn_start", "bn_fixed", "teacher_ema", "knn_refine",
                                             "knn_refine_labelled", "second_stage_steps", "reliable_entropy",
                                             "reliable_reweight", "anchor", "anchor_weight", "collapse_fallback",
                                             "wise_alpha"}
    with pytest.raises(ValueError, match="bn_start, teacher_ema are options of the T3AR family .*, not of tent"):
        AdaptConfig(method="tent", bn_start=True, teacher_ema=0.5)


def test_a_group_checks_its_options_and_adds_its_steps() -> None:
    def check(config: AdaptConfig) -> None:
        if config.lr > 0.5:
            raise ValueError("grouped: lr above 0.5")

    registry.register(MethodSpec("grouped", "tent with a group", step="t3ar.method.tent:Tent", groups=(
        OptionGroup("g", ("lr",), check=check, added_steps=lambda config: 7),)))
    try:
        assert planned_steps(AdaptConfig(method="grouped", epochs=2, batch_size=4), 12) == 6 + 7
        with pytest.raises(ValueError, match="grouped: lr above 0.5"):
            AdaptConfig(method="grouped", lr=0.6)
        AdaptConfig(method="tent", lr=0.6)  # another method's group checks nothing here
    finally:
        registry.unregister("grouped")


def test_the_config_layer_does_not_import_torch() -> None:
    """The services and the CLI validate configs, size jobs and list the methods without loading torch."""
    code = ("import sys; from t3ar.method.config import AdaptConfig; from t3ar.method import registry; "
            "from t3ar.jobsize import planned_steps; "
            "[planned_steps(AdaptConfig(method=n, k=1), 10) for n in registry.names()]; "
            "AdaptConfig.model_json_schema(); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT / "shared")})
    assert out.stdout.strip() == "False", out.stderr

"""Named T3AR configurations: expansion, the services' default, and the product following the benchmark."""

import json
from pathlib import Path
from typing import Any

import pytest

from t3ar.errors import InvalidInputError
from t3ar.method import registry
from t3ar.method.config import AdaptConfig
from t3ar.method.presets import ACCEPTANCE_ROUND, DEFAULT_METHOD, DEFAULT_PRESET, PRESETS, expand, with_default

REPORT = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "adaptation-cpu.json"


def test_a_preset_fills_what_the_config_does_not_give() -> None:
    assert expand({"preset": "paper", "k": 3}) == {"preset": "paper", "k": 3}
    assert expand({"k": 3}) == {"k": 3}
    cfg = AdaptConfig(preset="validated")
    for name, value in PRESETS["validated"].items():
        assert getattr(cfg, name) == (tuple(value) if isinstance(value, list) else value)
    assert AdaptConfig(preset="validated", k=7).k == 7  # given wins
    assert AdaptConfig(preset="paper") == AdaptConfig(preset="paper", **PRESETS["paper"])
    with pytest.raises(ValueError, match="preset"):
        AdaptConfig.model_validate({"preset": "best"})


def test_the_services_default_preset_applies_to_the_t3ar_family_only() -> None:
    default = with_default({})
    assert default["method"] == DEFAULT_METHOD["test"]
    assert default.get("preset") == (DEFAULT_PRESET if default["method"] in registry.family() else None)
    assert with_default({"mode": "train"})["method"] == DEFAULT_METHOD["train"]
    assert with_default({"method": "t3ar-noretrieval"})["preset"] == DEFAULT_PRESET
    assert "preset" not in with_default({"method": "shot-im"})
    assert with_default({"method": "t3ar", "preset": "paper"})["preset"] == "paper"


def test_the_api_gives_t3ar_jobs_the_default_preset_and_refuses_an_unknown_one() -> None:
    from t3ar_services.api.uploads import parse_config, validate_config

    def parse(raw: str) -> Any:
        return validate_config(parse_config(raw))

    cfg = parse('{"method": "t3ar", "k": 3}')
    assert cfg.preset == DEFAULT_PRESET and cfg.k == 3
    tent = parse('{"method": "tent"}')
    assert "preset" not in tent.model_dump()  # presets are the T3AR family's
    with pytest.raises(InvalidInputError, match="preset is an option of the T3AR family .*, not of tent"):
        parse('{"method": "tent", "preset": "paper"}')
    with pytest.raises(InvalidInputError, match="k is an option of the T3AR family .*, not of tent"):
        parse('{"method": "tent", "k": 3}')  # accepted and ignored before
    with pytest.raises(InvalidInputError, match=r"retrieval.k \(k\): .* \(allowed: k >= 0 and <= 64\)"):
        parse('{"method": "t3ar", "k": 99}')
    with pytest.raises(InvalidInputError, match="preset"):
        parse('{"preset": "best"}')


def test_the_product_follows_the_committed_method_benchmark() -> None:
    """The validated preset is what the cpu plan froze on validation, and it is the default only where it beat
    the paper-faithful T3AR there."""
    sel = json.loads(REPORT.read_text())["selection"]
    # the acceptance round's frozen options are recorded, and not (yet) the preset: a job with them diverged on a
    # small model (presets.py); the preset stays the labelled-pool round's (in git at 48856dc)
    assert ACCEPTANCE_ROUND == sel["labelled"]["options"]
    assert PRESETS["validated"] == {"temperature": 0.2, "second_stage_steps": 10, "pool_label_weight": 2.0,
                                    "pool_label_balance": True}
    # the validated T3AR with its no-harm options against the paper-faithful one, on validation
    assert DEFAULT_PRESET == ("validated" if sel["validated_top1_no_harm"] > sel["paper_top1"] else "paper")
    assert DEFAULT_METHOD["test"] == sel["default"]["method"]

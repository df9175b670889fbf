"""A job's acceptance options (job-level, beside its AdaptConfig, never inside it) and the config of each candidate.

Pure data, no torch: the services validate a submission with it. A job with a holdout evaluates its candidates on
it (:mod:`t3ar.candidates`) and returns the winner (:mod:`t3ar.acceptance`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from t3ar.acceptance import BASE, BN_ADAPT, DEFAULT_RULE, Rule, simplicity_order
from t3ar.errors import InvalidInputError
from t3ar.method import config as method_config
from t3ar.method import registry
from t3ar.method.config import AdaptConfig
from t3ar.method.presets import with_default

#: the options a candidate other than the requested method takes from the job's config (when the config has them):
#: the data it sees and the budget it gets; the method's own options are its defaults
SHARED_OPTIONS = ("fraction", "seed", "epochs", "min_steps", "batch_size", "lr", "train_groups", "k", "r", "amp",
                  "views_ahead", "bank_size")
MAX_CANDIDATES = 8


class AcceptanceOptions(BaseModel):
    """``candidates``: the methods to evaluate (None = ``source``, ``bn-adapt`` and the job's method);
    ``require_gain``: fail the job when the winner is the base model; ``rule``: the winner rule."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    candidates: tuple[str, ...] | None = Field(default=None, min_length=1, max_length=MAX_CANDIDATES)
    require_gain: bool = False
    rule: Rule = DEFAULT_RULE

    @field_validator("candidates")
    @classmethod
    def _known(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v is None:
            return v
        known = registry.names()
        unknown = [c for c in v if c not in known]
        if unknown:
            raise ValueError(f"unknown candidate(s) {', '.join(unknown)}; each is one of {', '.join(known)}")
        return tuple(dict.fromkeys(v))


def parse_options(candidates: str | list[str] | tuple[str, ...] | None, require_gain: bool,
                  rule: str | None) -> AcceptanceOptions:
    """Options from a form or a command line (``candidates`` comma-separated or a list; empty = the default);
    InvalidInputError naming the bad value."""
    if isinstance(candidates, str):
        names: list[str] | None = [c.strip() for c in candidates.split(",") if c.strip()] or None
    else:
        names = list(candidates) if candidates else None
    try:
        return AcceptanceOptions(candidates=tuple(names) if names else None, require_gain=require_gain,
                                 rule=rule or DEFAULT_RULE)  # type: ignore[arg-type]
    except ValidationError as e:
        raise InvalidInputError("invalid acceptance options: " + "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'options'}: {err['msg']}" for err in e.errors())) from e


def candidate_names(options: AcceptanceOptions, config: AdaptConfig) -> list[str]:
    """The candidates in simplicity order: the listed ones, or the base model, bn-adapt and the job's method."""
    names = list(options.candidates) if options.candidates else [BASE, BN_ADAPT, config.method]
    return simplicity_order(names)


def candidate_config(config: AdaptConfig, name: str) -> AdaptConfig:
    """The config candidate ``name`` runs with: the job's own for its method; otherwise that method's defaults (a
    T3AR-family one with the default preset) with the job's data and budget (:data:`SHARED_OPTIONS`), at test
    time for a method without a train-time mode."""
    if name == config.method:
        return config
    given, accepted = config.flat(), method_config.config_class(name).flat_fields()
    out: dict[str, Any] = {k: given[k] for k in SHARED_OPTIONS if k in given and k in accepted}
    out["method"] = name
    out["mode"] = config.mode if registry.get(name).train_mode else "test"
    return AdaptConfig.model_validate(with_default(out))

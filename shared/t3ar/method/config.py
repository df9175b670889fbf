"""The adaptation config: a union of one frozen model per method, carried in the job and saved in the checkpoint.

Design:

* :class:`AdaptConfig` is the common base: the fields every method reads (``method``, ``mode``, the data:
  ``fraction``, ``seed``) and the hooks generic code reads (:attr:`~AdaptConfig.retrieval_options`,
  :attr:`~AdaptConfig.bank_entries`, :meth:`~AdaptConfig.added_steps`, :meth:`~AdaptConfig.added_passes`). It is
  never an instance itself. :class:`StatisticsConfig` adds what ``bn-adapt`` reads (``batch_size``,
  ``train_groups``), :class:`OptimiserConfig` what a method with optimiser steps reads (the schedule: ``epochs``,
  ``min_steps``, ``batch_size``, ``lr``, ``momentum``, ``weight_decay``, ``warmup_frac``; the loop's switches ``amp``
  and ``views_ahead``), :class:`GroupsConfig` adds what trains (``train_groups``: every method with optimiser
  steps but ``tent``, ``sar`` and ``eata``, which train the norm layers' affine parameters alone and refuse it):
  ``source`` takes none of them.
* Each method's config is a subclass whose ``method`` is a ``Literal`` of its name(s), defined and registered
  beside the method's declaration (:class:`~t3ar.method.registry.MethodSpec`'s ``config``; a method without options
  of its own gives none and the registry makes the base's with its name). The registry builds the union of every
  registered class, entry-point methods included, as a pydantic ``TypeAdapter`` discriminated on ``method``, built
  when first needed and again after a registration.
* :func:`adapt_config` (``**fields``), ``AdaptConfig.model_validate(data)`` and a pydantic field typed ``AdaptConfig``
  (the job contract's ``JobSpec.config``) all validate through that union and give the method's own class
  (``AdaptConfig(...)`` itself is a TypeError: no constructor returns another class); its JSON schema is
  the union's (``oneOf`` with a ``method`` discriminator). A field of another method is refused, naming the field and
  the methods it belongs to (the API answers 422).
* The T3AR family's config (:class:`t3ar.method.specs.family.T3ARConfig`) nests its groups of options as sub-models
  (retrieval, pool data, pool labels, BatchNorm, teacher, refinement, second stage, safeguards), each checking its own
  interactions; the family's config checks those across groups. Its canonical form is the nested one (what
  ``model_dump`` gives, the API answers and the checkpoint stores) and its only attribute names
  (``config.retrieval.k``). The flat names of earlier versions (``{"k": 3, "second_stage_steps": 10}``) are a
  compatibility parse at the input edge alone (:func:`nest`, from :attr:`AdaptConfig.FLAT`: configs stored by earlier
  versions, old clients): mapped into the groups when validated, never an attribute.

This module stays free of torch: the services validate configs with it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    TypeAdapter,
    ValidationError,
    create_model,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

from t3ar.method import registry
from t3ar.method.presets import DEFAULT_METHOD

#: upper bounds of the config's open-ended fields: what a job may ask for at all; operators cap steps, wall time
#: and memory per job lower in the API's settings
MAX_STEPS = 1_000_000
MAX_BANK_SIZE = 262_144
MAX_SEED = 2**32 - 1
MAX_WEIGHT = 1000.0
#: switches of the T3AR family that no benchmark round kept: out of the product, the benchmarks' alone
#: (:class:`t3ar.method.probe.Probe`); a config naming one is refused saying so
PROBE_SWITCHES: tuple[str, ...] = ("bn_start", "bn_fixed", "teacher_ema", "pool_negatives", "redraw_neighbours",
                                   "reliable_entropy", "reliable_reweight", "collapse_fallback")
#: what the T3AR family does with a retrieved neighbour that the model predicts in the query's own (pseudo-)class:
#: keep it as a negative (the paper), mask it out of the negatives, or make it a positive
FalseNegatives = Literal["keep", "mask", "positive"]
#: the loops' switch for views made one step ahead (t3ar.method.ahead), in every training config
ViewsAhead = Annotated[bool | None, Field(
    description="make the next batch's views on a background thread while the current step runs (the same "
                "results either way); None = on the CPU and CUDA")]


class Options(BaseModel):
    """A group of a method's options (a sub-model of its config): frozen, no unknown field. A group checks its own
    fields' interactions in a ``model_validator(mode="after")``; ``added_steps`` and ``added_passes`` say what it adds
    to a job's budget (counted against the API's step cap by :func:`t3ar.jobsize.planned_steps`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def added_steps(self) -> int:
        """Optimiser steps the group runs after the first stage's."""
        return 0

    def added_passes(self) -> int:
        """Passes over the target with gradient but no optimiser step the group runs (each counted as an epoch)."""
        return 0


class RetrievalOptions(Options):
    """How a retrieval method draws each target image's pool neighbours (any method whose spec retrieves)."""

    k: int = Field(default=5, ge=0, le=64, description="retrieved pool neighbours per target image")
    r: int = Field(default=5, ge=1, le=20, description="dedup: sample k of the top r*k neighbours")
    dedup_threshold: float | None = Field(
        default=None, gt=0, le=1, description="drop candidates whose retriever similarity to the query is >= this "
                                              "(near-duplicates) before sampling")
    false_negatives: FalseNegatives = Field(
        default="keep", description="a retrieved neighbour whose filtered pseudo-label is the query's (pseudo-)label: "
                                    "keep it as a negative (the paper), mask it out of the query's negatives, or "
                                    "make it a positive of the query")
    ranking: Literal["index", "base-rerank", "class-conditional"] = Field(
        default="index", description="how candidates are ranked (issue 52; t3ar.retrieval_ranking): index = the "
                                     "pool's index (R); base-rerank = the index's candidates re-ranked by the base "
                                     "model's features with BatchNorm statistics of the target; class-conditional = "
                                     "the nearest among items labelled with the image's confident pseudo-label, the "
                                     "index's candidates after them")
    candidates: Literal["fixed", "scaled"] = Field(
        default="fixed", description="candidates asked per query before ranking: fixed = r*k; scaled = r*k doubled "
                                     "for every tenfold of the pool beyond 10,000 items (t3ar.method.ranking."
                                     "candidate_count), the r*k best after ranking kept")
    min_confidence: float = Field(
        default=0.5, ge=0, le=1, description="class-conditional: the softmax probability a pseudo-label needs "
                                             "(a fixed prior, not tuned on any evaluation image)")


@dataclass(frozen=True)
class PoolUse:
    """What a job reads of its retrieved pool items beside their images (:meth:`AdaptConfig.pool_use`): whether
    they serve as training data (``as_data``), whether it needs their pool labels (``labels``), and the sources whose
    items may serve as data (``sources``; None = every source, or none needed)."""

    as_data: bool = False
    labels: bool = False
    sources: tuple[str, ...] | None = None


def _is_union_root(source: Any) -> bool:
    return isinstance(source, type) and BaseModel in source.__bases__ and source.__name__ == "AdaptConfig"


class AdaptConfig(BaseModel):
    """The fields every method reads (see the module). ``mode='test'``: T is unlabelled; ``mode='train'``: T is
    labelled (train-time adaptation) and methods with a train-time mode use its labels.

    A method's own config subclasses this with ``method: Literal[<its name>]``; validating ``AdaptConfig`` itself
    (:func:`adapt_config`, ``model_validate``) gives the class of the ``method`` named (the registry's union).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: flat option name -> (group field, option name in the group): the flat form a config class still accepts
    FLAT: ClassVar[Mapping[str, tuple[str, str]]] = {}

    method: str = Field(description="the adaptation method: a name of the method registry (t3ar.method.registry)")
    mode: Literal["test", "train"] = "test"
    # data
    fraction: float = Field(default=1.0, gt=0, le=1)
    seed: int = Field(default=0, ge=0, le=MAX_SEED)

    # --- the union: AdaptConfig.model_validate(...) and a field typed AdaptConfig give the method's own class

    def __init__(self, /, **data: Any) -> None:
        if _is_union_root(type(self)):
            raise TypeError("AdaptConfig is the union of the methods' configs, not a class of its own: "
                            "adapt_config(**fields) or AdaptConfig.model_validate(data) gives the method's config")
        super().__init__(**data)

    # it validates as the base's does: pydantic's validation need not call it (pydantic's RootModel marks its own so)
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        if not _is_union_root(source):  # a method's own config: its fields
            return handler(source)
        return core_schema.no_info_plain_validator_function(
            lambda value: validate(value), serialization=core_schema.plain_serializer_function_ser_schema(
                lambda c, info: c.model_dump(mode=info.mode), info_arg=True))

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: core_schema.CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        if not _is_union_root(cls):
            return super().__get_pydantic_json_schema__(schema, handler)
        return handler(config_adapter().core_schema)

    # --- checks of every method

    @model_validator(mode="before")
    @classmethod
    def _foreign(cls, data: Any) -> Any:
        """A field of another method's config is refused, naming it and the methods it is an option of."""
        if not isinstance(data, Mapping) or _is_union_root(cls):
            return data
        mine = set(cls.model_fields) | set(cls.FLAT)
        foreign = [f for f in data if f not in mine]
        if not foreign:
            return nest(cls, data)
        owners = option_owners()
        method = data.get("method", "?")
        by_owners: dict[tuple[str, ...], list[str]] = {}
        for f in foreign:
            by_owners.setdefault(owners.get(str(f), ()), []).append(str(f))
        parts = []
        for of, fields in by_owners.items():
            what = f"{', '.join(fields)} {'is' if len(fields) == 1 else 'are'}"
            if not of and all(f in PROBE_SWITCHES for f in fields):
                parts.append(f"{what} not an option of {method}: no benchmark round kept "
                             f"{'it' if len(fields) == 1 else 'them'}, and only the benchmarks set "
                             f"{'it' if len(fields) == 1 else 'them'} (t3ar.method.probe.Probe; docs/method.md)")
                continue
            if not of:
                parts.append(f"{what} not an option of {method} (nor of any registered method)")
                continue
            whose = (f"the T3AR family ({', '.join(of)})" if all(registry.get(m).family for m in of)
                     else ", ".join(of))
            parts.append(f"{what} {'an option' if len(fields) == 1 else 'options'} of {whose}, not of {method}")
        raise ValueError("; ".join(parts))

    @model_validator(mode="after")
    def _check(self) -> AdaptConfig:
        retrieval = self.retrieval_options
        if self.uses_retrieval and (retrieval is None or retrieval.k < 1):
            raise ValueError(f"method {self.method} retrieves neighbours: k must be >= 1")
        if self.mode == "train" and not self.has_train_mode:
            raise ValueError(f"{self.method} is a test-time method (no labels); use a method with a train-time "
                             f"mode ({', '.join(n for n in registry.names() if registry.get(n).train_mode)}) "
                             "with mode 'train'")
        return self

    # --- what generic code reads

    @property
    def spec(self) -> registry.MethodSpec:
        """The registry's declaration of :attr:`method`."""
        return registry.get(self.method)

    @property
    def in_family(self) -> bool:
        """The T3AR family (bank, filtered pseudo-labels, InfoNCE)."""
        return self.spec.family

    @property
    def uses_retrieval(self) -> bool:
        return self.spec.retrieval is not None

    @property
    def has_train_mode(self) -> bool:
        return self.spec.train_mode

    @property
    def retrieval_options(self) -> RetrievalOptions | None:
        """How the method draws pool neighbours; None for a method that reads no pool."""
        return None

    @property
    def bank_entries(self) -> int:
        """Entries of the memory bank or queue the method holds for the job (its memory estimate); 0 = none."""
        return 0

    def pool_use(self) -> PoolUse:
        """What the job reads of its pool beside the images (the harness fetches it: :mod:`t3ar.pipeline`): by
        default the pool labels where false negatives are told by their label."""
        retrieval = self.retrieval_options
        return PoolUse(labels=retrieval is not None and retrieval.false_negatives != "keep")

    def groups(self) -> dict[str, Options]:
        """The config's groups of options (sub-models), by field name."""
        return {name: value for name in type(self).model_fields if isinstance(value := getattr(self, name), Options)}

    def added_steps(self) -> int:
        """Optimiser steps the config runs after the first stage's (its groups')."""
        return sum(group.added_steps() for group in self.groups().values())

    def added_passes(self) -> int:
        """Passes over the target with gradient but no optimiser step the config runs (its groups')."""
        return sum(group.added_passes() for group in self.groups().values())

    @classmethod
    def flat_fields(cls) -> dict[str, Any]:
        """Each option the config accepts flat (its own fields and its groups' flat names) -> its FieldInfo."""
        out: dict[str, Any] = {n: f for n, f in cls.model_fields.items() if not _is_group(f.annotation)}
        for flat, (group, name) in cls.FLAT.items():
            out[flat] = cls.model_fields[group].annotation.model_fields[name]  # type: ignore[union-attr]
        return out

    def flat(self) -> dict[str, Any]:
        """The config's options in the flat form (every group's options under their flat names)."""
        out = {n: getattr(self, n) for n in type(self).model_fields if n not in self.groups()}
        out.update({flat: getattr(getattr(self, group), name) for flat, (group, name) in self.FLAT.items()})
        return out


#: the options of a method that reads the target in batches (bn-adapt's statistics, every optimiser)
BatchSize = Annotated[int, Field(ge=2, le=4096)]
#: the last N backbone groups that train (or whose BatchNorm statistics bn-adapt sets); None = all
TrainGroups = Annotated[int | None, Field(ge=0, le=64, description="last N backbone groups that train; None=all")]


class StatisticsConfig(AdaptConfig):
    """A method that sets the target's BatchNorm statistics in one pass, without an optimiser (``bn-adapt``): the
    batch it reads and which groups' statistics it sets."""

    batch_size: BatchSize = 32
    train_groups: TrainGroups = 2


class OptimiserConfig(AdaptConfig):
    """A method with optimiser steps: the schedule, what trains and the loop's switches (every method whose spec
    names a step class; a method without options of its own gets this class with its name)."""

    # schedule
    epochs: int = Field(default=10, ge=1, le=1000)
    min_steps: int = Field(default=0, ge=0, le=MAX_STEPS,
                           description="lower bound on optimiser steps (tiny fractions of T)")
    batch_size: BatchSize = 32
    lr: float = Field(default=0.001, gt=0, le=10)
    momentum: float = Field(default=0.9, ge=0, lt=1)
    weight_decay: float = Field(default=1e-4, ge=0, le=1)
    warmup_frac: float = Field(default=0.1, ge=0, lt=1, description="fraction of steps of linear warm-up")
    amp: bool = Field(default=True, description="mixed precision on CUDA (ignored on CPU)")
    views_ahead: ViewsAhead = None


class GroupsConfig(OptimiserConfig):
    """A method with optimiser steps that trains the last ``train_groups`` backbone groups (the default of a
    method with optimiser steps; ``tent``, ``sar`` and ``eata`` train the norm layers' affine parameters alone and
    take :class:`OptimiserConfig`, which refuses ``train_groups`` naming the method)."""

    train_groups: TrainGroups = 2


def trained(config: AdaptConfig) -> OptimiserConfig:
    """``config`` as a config with optimiser steps (TypeError naming the method when its method has none)."""
    if not isinstance(config, OptimiserConfig):
        raise TypeError(f"{config.method} runs no optimiser steps: its config has no schedule")
    return config


def train_groups(config: OptimiserConfig) -> int | None:
    """The last N backbone groups that train with ``config`` (None = all; TypeError naming the method when its
    config has none: its step says what trains)."""
    if not isinstance(config, GroupsConfig):
        raise TypeError(f"{config.method} has no train_groups option: its step names what trains")
    return config.train_groups


def statistics(config: AdaptConfig) -> StatisticsConfig:
    """``config`` as the config of a method that sets BatchNorm statistics without an optimiser (TypeError naming
    the method otherwise)."""
    if not isinstance(config, StatisticsConfig):
        raise TypeError(f"{config.method} sets no BatchNorm statistics without an optimiser")
    return config


class ContrastiveConfig(GroupsConfig):
    """The fields of the methods with a memory bank and a contrastive loss (AdaContrast, the T3AR family)."""

    temperature: float = Field(default=0.07, gt=0, le=100)
    ce_weight: float = Field(default=1.0, ge=0, le=MAX_WEIGHT)
    contrastive_weight: float = Field(default=1.0, ge=0, le=MAX_WEIGHT)
    diversity_weight: float | None = Field(
        default=None, ge=0, le=MAX_WEIGHT,
        description="diversity term weight; None = the method's own (AdaContrast 1, else 0)")
    bank_size: int = Field(default=16384, ge=8, le=MAX_BANK_SIZE, description="memory bank / MoCo queue entries")

    @property
    def bank_entries(self) -> int:
        return self.bank_size

    @property
    def resolved_diversity_weight(self) -> float:
        if self.diversity_weight is not None:
            return self.diversity_weight
        return self.spec.diversity_weight


def _is_group(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, Options)


def nest(cls: type[AdaptConfig], data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with each flat option of ``cls`` (:attr:`AdaptConfig.FLAT`) moved into its group; an option given
    in its group wins over the same one given flat."""
    out = dict(data)
    for flat, (group, name) in cls.FLAT.items():
        if flat in out:
            value = out.pop(flat)
            sub = out.get(group)
            if sub is None:
                out[group] = sub = {}
            if isinstance(sub, Mapping):
                out[group] = {name: value, **sub}
    return out


def _with_method(data: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(data)
    if "method" not in out:
        mode = out.get("mode", "test")
        out["method"] = DEFAULT_METHOD.get(mode if isinstance(mode, str) else "test", DEFAULT_METHOD["test"])
    elif isinstance(out["method"], str):
        registry.get(out["method"])  # ValueError naming the registered methods
    return out


def adapt_config(**fields: Any) -> AdaptConfig:
    """The config of ``fields`` (``method`` names its class; none: the default method), validated through the union
    (:func:`validate`): ``adapt_config(method="t3ar", retrieval={"k": 3})``."""
    return validate(fields)


def validate(data: Any) -> AdaptConfig:
    """``data`` (a mapping of options, flat or nested; no ``method``: the default one) as its method's config.
    ValidationError when it is not one (an unknown method included)."""
    if isinstance(data, AdaptConfig):
        return data
    if isinstance(data, Mapping):
        try:
            data = _with_method(data)
        except ValueError as e:
            raise ValidationError.from_exception_data("AdaptConfig", [
                {"type": "value_error", "loc": ("method",), "input": data.get("method"),
                 "ctx": {"error": e}}]) from None
    out: AdaptConfig = config_adapter().validate_python(data)
    return out


def error_lines(error: ValidationError) -> list[str]:
    """``error``'s messages as ``'<option path>: <message>'``, without the union's method tag; a group's option
    also under its flat name (``refinement.neighbors (refine_neighbors): ...``)."""
    methods = set(registry.names())
    flat = {where: name for cls in config_classes() for name, where in cls.FLAT.items()}
    out = []
    for err in error.errors():
        loc = list(err["loc"])
        if loc and loc[0] in methods:
            loc = loc[1:]
        path = ".".join(str(p) for p in loc) or "config"
        alias = flat.get((str(loc[0]), str(loc[1]))) if len(loc) == 2 else None
        out.append(f"{path}{f' ({alias})' if alias else ''}: {err['msg']}")
    return out


def field_info(cls: type[AdaptConfig], loc: tuple[Any, ...]) -> Any:
    """The FieldInfo of the option at ``loc`` (an error's, without the union's tag) in ``cls``; None if none."""
    model: Any = cls
    info = None
    for part in loc:
        fields = getattr(model, "model_fields", {})
        flat = getattr(model, "FLAT", {}).get(part)
        if part in fields:
            info = fields[part]
        elif flat is not None:
            info = fields[flat[0]].annotation.model_fields[flat[1]]
        else:
            return None
        model = info.annotation if _is_group(info.annotation) else None
    return info


# --- the union of the registered methods' configs (the registry says which; this module builds it)

_UNION = ""  # the union adapter's key in registry.DERIVED (a method name is never empty)


def config_class(name: str) -> type[AdaptConfig]:
    """The config class of method ``name``: its spec's, or the common fields' with ``method`` naming it."""
    spec = registry.get(name)
    if spec.config is not None:
        cls: type[AdaptConfig] = spec.config
        return cls
    with registry.lock():
        made = registry.DERIVED.get(name)
        if made is None:
            tag: Any = Literal[name]
            title = "".join(part.capitalize() for part in re.split(r"[^A-Za-z0-9]+", name)) + "Config"
            base = GroupsConfig if spec.optimises else StatisticsConfig if spec.bn_statistics else AdaptConfig
            made = registry.DERIVED[name] = create_model(title, __base__=base,
                                                         __module__=AdaptConfig.__module__, method=(tag, name))
        out: type[AdaptConfig] = made
        return out


def config_classes() -> tuple[type[AdaptConfig], ...]:
    """Every registered method's config class, once each (a class may serve several methods), in registration
    order."""
    return tuple(dict.fromkeys(config_class(n) for n in registry.names()))


def config_adapter() -> TypeAdapter[AdaptConfig]:
    """The pydantic adapter of the union of every registered method's config, discriminated on ``method`` (built
    on first use and again after a registration)."""
    with registry.lock():
        adapter = registry.DERIVED.get(_UNION)
        if adapter is None:
            classes = config_classes()
            union: Any = classes[0] if len(classes) == 1 else Annotated[Union[classes], Field(discriminator="method")]  # noqa: UP007
            adapter = registry.DERIVED[_UNION] = TypeAdapter(union, config=ConfigDict(title="AdaptConfig"))
        out: TypeAdapter[AdaptConfig] = adapter
        return out


def option_owners() -> dict[str, tuple[str, ...]]:
    """Each option some method's config accepts (a field, a group, or a group's option by its flat name:
    :meth:`AdaptConfig.flat_fields`) -> the names of the methods that accept it (in registration order)."""
    owners: dict[str, list[str]] = {}
    for name in registry.names():
        cls = config_class(name)
        for option in dict.fromkeys([*cls.model_fields, *cls.flat_fields()]):
            owners.setdefault(option, []).append(name)
    return {option: tuple(methods) for option, methods in owners.items()}

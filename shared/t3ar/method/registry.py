"""The method registry: every adaptation method declares itself here once, by name, with what it is.

A method is one :class:`MethodSpec`, registered where the method is declared (like timm's ``@register_model``):

* the built-in methods each declare themselves in a module of :mod:`t3ar.method.specs` (torch-free, so that the
  services and the CLI validate configs without loading torch); their step classes are named as
  ``"module:Class"`` and imported when a job first needs them;
* a method of another package registers from its own module, either with :func:`register_method` on its step
  class or :func:`register` on a spec, and names that module in the entry-point group ``t3ar.methods`` (or
  imports it before it validates a config).

Everything that used to switch on a method's name reads the spec instead: the config's validation and
properties (:class:`t3ar.method.config.AdaptConfig`), the presets (the T3AR family), the CLI's ``--method``
choices, the API's schema, job sizing (:mod:`t3ar.jobsize`), the loop (:func:`t3ar.method.adapt.adapt`) and the
pipeline (:mod:`t3ar.pipeline`). No torch here.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Literal, TypeVar

if TYPE_CHECKING:
    from t3ar.method.base import MethodStep
    from t3ar.method.config import AdaptConfig

#: how a retrieval method finds a target image's neighbours in the pool: its nearest by the retriever's
#: embedding, or drawn at random (the control arm)
Retrieval = Literal["nearest", "random"]
#: the entry-point group whose modules register methods of other packages (imported with the built-in ones)
ENTRY_POINT_GROUP = "t3ar.methods"


def _no_steps(config: AdaptConfig) -> int:
    return 0


def _no_check(config: AdaptConfig) -> None:
    return None


@dataclass(frozen=True)
class OptionGroup:
    """A group of a method's options: a few config fields that act together (the T3AR family's BatchNorm,
    refinement, second stage, ...). ``check`` raises ValueError on a bad combination of them (the config calls it
    when it validates a config of a method with the group); ``added_steps``: optimiser steps the group runs after
    the first stage's (counted against the API's step cap); ``added_passes``: passes over the target with gradient
    (a forward and a backward per batch, no optimiser step: the Fisher anchor's estimate) the group runs, each
    counted against the step cap as an epoch of steps; ``own``: the fields only methods with this group
    accept set (off by default: the config refuses them set, true or non-zero, for any other method)."""

    name: str
    fields: tuple[str, ...]
    own: tuple[str, ...] = ()
    check: Callable[[AdaptConfig], None] = field(default=_no_check, compare=False)
    added_steps: Callable[[AdaptConfig], int] = field(default=_no_steps, compare=False)
    added_passes: Callable[[AdaptConfig], int] = field(default=_no_steps, compare=False)


@dataclass(frozen=True)
class MethodSpec:
    """One adaptation method: its name and its static properties.

    ``step``: the :class:`~t3ar.method.base.MethodStep` that computes a step's loss, or ``"module:Class"`` naming
    it (imported when first needed: the declaration stays free of torch), or None for a method without an
    optimiser (``source``: the model as it is; ``bn_statistics``: one no-gradient pass that sets the target's
    BatchNorm statistics). ``retrieval``: how the method finds pool neighbours (None = it reads no pool).
    ``train_mode``: it also runs at train time, with the target's labels. ``family``: the T3AR family (memory
    bank, filtered pseudo-labels, InfoNCE): its presets and options apply. ``bank``: it holds a memory bank or
    queue of ``config.bank_size`` entries (job memory). ``diversity_weight``: the diversity term's weight when
    the config gives none. ``groups``: the method's own groups of options (:class:`OptionGroup`): their checks run
    when a config of the method validates, and the steps and passes they add count in
    :func:`t3ar.jobsize.planned_steps`.
    """

    name: str
    summary: str
    step: type[MethodStep] | str | None = None
    bn_statistics: bool = False
    retrieval: Retrieval | None = None
    train_mode: bool = True
    family: bool = False
    bank: bool = False
    diversity_weight: float = 0.0
    groups: tuple[OptionGroup, ...] = ()

    @property
    def optimises(self) -> bool:
        """The method runs optimiser steps (a step class); ``source`` and ``bn-adapt`` do not."""
        return self.step is not None

    def added_steps(self, config: AdaptConfig) -> int:
        """Optimiser steps ``config`` runs after the first stage's (its groups' ``added_steps``)."""
        return sum(group.added_steps(config) for group in self.groups)

    def added_passes(self, config: AdaptConfig) -> int:
        """Passes over the target with gradient but no optimiser step that ``config`` runs (its groups')."""
        return sum(group.added_passes(config) for group in self.groups)

    def check(self, config: AdaptConfig) -> None:
        """Each of the method's groups checks its options' interactions in ``config`` (ValueError)."""
        for group in self.groups:
            group.check(config)

    def step_class(self) -> type[MethodStep] | None:
        """The method's step class, imported on first use when the spec names it as ``"module:Class"``."""
        if self.step is None or isinstance(self.step, type):
            return self.step
        module, _, name = self.step.partition(":")
        impl: type[MethodStep] = getattr(importlib.import_module(module), name)
        return impl


_REGISTRY: dict[str, MethodSpec] = {}
_LOADED = False
_LOCK = threading.RLock()

S = TypeVar("S", bound="type[MethodStep]")


def register(spec: MethodSpec) -> MethodSpec:
    """Add ``spec`` to the registry (again with an equal spec is a no-op: a module imported twice); a second,
    different method of the same name is an error."""
    if not spec.name or spec.name != spec.name.strip():
        raise ValueError(f"a method's name must be a non-empty word, got {spec.name!r}")
    with _LOCK:
        old = _REGISTRY.get(spec.name)
        if old is not None and old != spec:
            raise ValueError(f"method {spec.name!r} is already registered (as {old.step!r})")
        _REGISTRY[spec.name] = spec
    return spec


def register_method(name: str, summary: str, **properties: object) -> Callable[[S], S]:
    """A class decorator: register the decorated :class:`~t3ar.method.base.MethodStep` as method ``name`` with
    the :class:`MethodSpec` ``properties`` given (retrieval, train_mode, family, bank, ...)."""

    def decorate(cls: S) -> S:
        register(MethodSpec(name, summary, step=cls, **properties))  # type: ignore[arg-type]
        return cls

    return decorate


def unregister(name: str) -> None:
    """Remove method ``name`` (tests that register a method of their own)."""
    with _LOCK:
        _REGISTRY.pop(name, None)


def _load() -> None:
    """Import the built-in declarations (:mod:`t3ar.method.specs`) and the entry-point group's modules, once."""
    global _LOADED
    if _LOADED:
        return
    with _LOCK:
        if _LOADED:
            return
        from t3ar.method import specs

        for info in sorted(pkgutil.iter_modules(specs.__path__), key=lambda m: m.name):
            importlib.import_module(f"{specs.__name__}.{info.name}")
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            importlib.import_module(ep.value.partition(":")[0])
        _LOADED = True


def names() -> tuple[str, ...]:
    """Every registered method's name, in registration order."""
    _load()
    return tuple(_REGISTRY)


def get(name: str) -> MethodSpec:
    """The spec of method ``name``; ValueError naming the known ones when there is none."""
    _load()
    spec = _REGISTRY.get(name)
    if spec is None:
        raise ValueError(f"unknown method {name!r}: one of {', '.join(_REGISTRY)}")
    return spec


def family() -> tuple[str, ...]:
    """The names of the T3AR family's methods (the presets and the family's options apply to them)."""
    return tuple(n for n in names() if _REGISTRY[n].family)


def owned_options() -> dict[str, tuple[str, ...]]:
    """Each field that some methods' groups own -> the names of those methods (in registration order)."""
    owners: dict[str, list[str]] = {}
    for name in names():
        for group in _REGISTRY[name].groups:
            for option in group.own:
                if name not in owners.setdefault(option, []):
                    owners[option].append(name)
    return {option: tuple(methods) for option, methods in owners.items()}

"""The method registry: every adaptation method declares itself here once, by name, with what it is.

A method is one :class:`MethodSpec`, registered where the method is declared (like timm's ``@register_model``):

* the built-in methods each declare themselves in a module of :mod:`t3ar.method.specs` (torch-free, so that the
  services and the CLI validate configs without loading torch); their step classes are named as
  ``"module:Class"`` and imported when a job first needs them;
* a method of another package registers from its own module, either with :func:`register_method` on its step
  class or :func:`register` on a spec, and names that module in the entry-point group ``t3ar.methods`` (or
  imports it before it validates a config).

A spec names its method's config class (``MethodSpec.config``, a subclass of
:class:`t3ar.method.config.AdaptConfig`); :mod:`t3ar.method.config` builds the union of every registered class
(:func:`t3ar.method.config.config_adapter`), which is what validating an ``AdaptConfig`` means. The registry is the
bottom of the method's imports: it imports no other module of :mod:`t3ar.method` (the declarations and the method
modules import it and register; their modules are imported by name, at first lookup).

Everything that used to switch on a method's name reads the spec or the config instead: the config's validation, the
presets (the T3AR family), the CLI's ``--method`` choices and option defaults, the API's schema, job sizing
(:mod:`t3ar.jobsize`), the loop (:func:`t3ar.method.adapt.adapt`) and the pipeline (:mod:`t3ar.pipeline`).
No torch here.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Literal, TypeVar, get_args

#: how a retrieval method finds a target image's neighbours in the pool: its nearest by the retriever's
#: embedding, or drawn at random (the control arm)
Retrieval = Literal["nearest", "random"]
#: the entry-point group whose modules register methods of other packages (imported with the built-in ones)
ENTRY_POINT_GROUP = "t3ar.methods"


@dataclass(frozen=True)
class MethodSpec:
    """One adaptation method: its name and its static properties.

    ``step``: the :class:`~t3ar.method.base.MethodStep` that computes a step's loss, or ``"module:Class"`` naming
    it (imported when first needed: the declaration stays free of torch), or None for a method without an
    optimiser (``source``: the model as it is; ``bn_statistics``: one no-gradient pass that sets the target's
    BatchNorm statistics). ``retrieval``: how the method finds pool neighbours (None = it reads no pool; a
    retrieval method's config has a ``retrieval`` group). ``train_mode``: it also runs at train time, with the
    target's labels. ``family``: the T3AR family (memory bank, filtered pseudo-labels, InfoNCE): its presets apply.
    ``diversity_weight``: the diversity term's weight when the config gives none. ``config``: the method's config
    class (a subclass of :class:`~t3ar.method.config.AdaptConfig` whose ``method`` is a ``Literal`` naming it,
    holding the method's own options and groups of options); None = the common fields alone.
    """

    name: str
    summary: str
    step: type[Any] | str | None = None  # a t3ar.method.base.MethodStep subclass
    bn_statistics: bool = False
    retrieval: Retrieval | None = None
    train_mode: bool = True
    family: bool = False
    diversity_weight: float = 0.0
    config: type[Any] | None = field(default=None, compare=False)  # a t3ar.method.config.AdaptConfig subclass

    @property
    def optimises(self) -> bool:
        """The method runs optimiser steps (a step class); ``source`` and ``bn-adapt`` do not."""
        return self.step is not None

    def step_class(self) -> type[Any] | None:
        """The method's step class (a :class:`~t3ar.method.base.MethodStep`), imported on first use when the spec
        names it as ``"module:Class"``."""
        if self.step is None or isinstance(self.step, type):
            return self.step
        module, _, name = self.step.partition(":")
        impl: type[Any] = getattr(importlib.import_module(module), name)
        return impl


_REGISTRY: dict[str, MethodSpec] = {}
_LOADED = False
#: what is derived from the registry (t3ar.method.config's made config classes and union): cleared when it changes
DERIVED: dict[str, Any] = {}
_LOCK = threading.RLock()
#: the package of the built-in declarations, imported by name on the first lookup (it imports the registry)
SPECS = "t3ar.method.specs"

S = TypeVar("S", bound=type)


def register(spec: MethodSpec) -> MethodSpec:
    """Add ``spec`` to the registry (again with an equal spec is a no-op: a module imported twice); a second,
    different method of the same name is an error, and so is a config class whose ``method`` does not name it."""
    if not spec.name or spec.name != spec.name.strip():
        raise ValueError(f"a method's name must be a non-empty word, got {spec.name!r}")
    if spec.config is not None and spec.name not in get_args(spec.config.model_fields["method"].annotation):
        raise ValueError(f"{spec.config.__name__}.method must be a Literal naming {spec.name!r}")
    with _LOCK:
        old = _REGISTRY.get(spec.name)
        if old is not None and old != spec:
            raise ValueError(f"method {spec.name!r} is already registered (as {old.step!r})")
        _REGISTRY[spec.name] = spec
        DERIVED.clear()
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
        DERIVED.clear()


def _load() -> None:
    """Import the built-in declarations (:mod:`t3ar.method.specs`) and the entry-point group's modules, once."""
    global _LOADED
    if _LOADED:
        return
    with _LOCK:
        if _LOADED:
            return
        specs = importlib.import_module(SPECS)
        for info in sorted(pkgutil.iter_modules(specs.__path__), key=lambda m: m.name):
            importlib.import_module(f"{SPECS}.{info.name}")
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


def lock() -> threading.RLock:
    """The registry's lock (what derives from it builds under it)."""
    return _LOCK

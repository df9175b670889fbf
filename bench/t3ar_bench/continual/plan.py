"""The continual benchmark's plans and arms.

Arms (one pool folder each per seed, every step from the base model):

* ``static``: the base pool only (clipart);
* ``growing``: the base pool plus every earlier target of the stream, each added after its step by the real
  contribution mechanism (:func:`t3ar.local_contribute.contribute_local`: exact and R's near-duplicates
  skipped);
* ``curated``: as ``growing``, then a compaction of the contributed targets after each contribution
  (:func:`t3ar.curation.plan_removals`, sources ``target:*``; the clipart is never touched);
* ``none``: the method without retrieval (``t3ar-noretrieval``), the reference.

The adaptation settings are the method benchmark's frozen choices (its results JSON's ``selection``: T3AR's lr,
contrastive setting and options; the no-retrieval method's lr and setting), never tuned here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from t3ar_bench.method.plans import RETRIEVAL_OPTIONS

ARMS: tuple[str, ...] = ("static", "growing", "curated", "none")
#: the diagnostic plan's added option: the method benchmark's "neighbours as data" candidate, as it defined it
DATA_OPTION = RETRIEVAL_OPTIONS[0]


@dataclass(frozen=True)
class ContinualPlan:
    name: str
    stream: tuple[str, ...]  # target styles, in order
    seeds: tuple[int, ...] = (0, 1, 2)
    epochs: int = 30
    max_steps: int | None = 40  # per run, the method benchmark's CPU cap
    batch_size: int = 32
    image_size: int = 64
    eval_share: float = 0.5  # of each style: held out for evaluation (never adapted on, never contributed)
    adapt_cap: int | None = 400  # images of each style adapted on (and contributed)
    pool_cap: int | None = None  # clipart images in the base pool (a seeded subset); None = all of them
    duplicate_threshold: float = 0.98  # contribution: R's near-duplicates skipped
    compact_threshold: float = 0.95  # curation: near-duplicates among contributed targets removed
    k: int = 5
    arms: tuple[str, ...] = ARMS
    #: AdaptConfig settings added to the frozen T3AR configuration of every pool arm: empty for the plans that
    #: measure the frozen configuration; a diagnostic plan names the option it adds and says why in ``note``
    options: tuple[tuple[str, Any], ...] = ()
    note: str = ""

    def describe(self) -> dict[str, Any]:
        return asdict(self)


PLANS: dict[str, ContinualPlan] = {
    # synthetic styles, a tiny random model: the plumbing in a couple of minutes (tests, CI)
    "smoke": ContinualPlan("smoke", stream=("ink", "neon", "pastel"), seeds=(0, 1), epochs=1, max_steps=2,
                           batch_size=8, image_size=32, adapt_cap=24, pool_cap=20, k=2),  # of 24: the cap is used
    # every emoji style the data kit can build after the source style (google), fluentflat (not in the method
    # benchmark's kit) last; the method benchmark's CPU budget (40 steps per run) and its whole clipart pool; 5
    # seeds (100 runs of about 20 s each on a quiet 2-core CPU)
    "cpu": ContinualPlan("cpu", stream=("twitter", "openmoji", "openmoji-black", "fluent3d", "fluentflat"),
                         seeds=(0, 1, 2, 3, 4)),
}
# a diagnostic, not the frozen configuration: retrieved neighbours as data (the method benchmark's first retrieval
# option, which its validation rejected), to see whether a growing pool pays once its images are used as data
PLANS["cpu-data"] = replace(
    PLANS["cpu"], name="cpu-data", arms=("static", "growing"), options=DATA_OPTION[1],
    note=f"Diagnostic, not the frozen configuration: every run adds `{DATA_OPTION[0]}` (the method benchmark's first "
         "retrieval option, rejected by its validation) to the frozen T3AR settings, to see whether a growing pool "
         "pays once its images serve as data (pseudo-labelled) rather than only as negatives. Nothing is chosen "
         "from it.")


def load_selection(path: Path | None) -> dict[str, Any]:
    """The method benchmark's frozen choices (``selection`` of its results JSON); empty = AdaptConfig defaults."""
    if path is None:
        return {}
    data = json.loads(Path(path).read_text())
    sel = data.get("selection")
    if not isinstance(sel, dict):
        raise ValueError(f"{path}: no 'selection' (a t3ar bench adapt results file has one)")
    return sel


def arm_config(plan: ContinualPlan, sel: Mapping[str, Any], arm: str, seed: int, n_adapt: int) -> dict[str, Any]:
    """The AdaptConfig fields of one run of ``arm`` on ``n_adapt`` images: the frozen lr and options of its
    method; epochs capped so a run takes at most ``max_steps`` steps (as the method benchmark's CPU plan)."""
    method = "t3ar-noretrieval" if arm == "none" else "t3ar"
    batch = max(2, min(plan.batch_size, n_adapt))
    per_epoch = max(1, -(-n_adapt // batch))
    epochs = plan.epochs if plan.max_steps is None else max(1, min(plan.epochs, plan.max_steps // per_epoch))
    out: dict[str, Any] = {"method": method, "mode": "test", "seed": seed, "epochs": epochs, "batch_size": batch,
                           **({"k": plan.k} if method == "t3ar" else {})}  # t3ar-noretrieval has no k
    if "validated" in sel:  # the grid protocol: the family's lr and term, T3AR's validated options
        out["lr"] = sel["lr"]["t3ar-noretrieval"]
        out.update(sel.get("term", {}) if method == "t3ar-noretrieval" else sel["validated"].get("options", {}))
        if method == "t3ar":
            out.update(dict(plan.options))
        return out
    if method in sel.get("lr", {}):  # the earlier protocol: per-method lr, contrastive setting, T3AR options
        out["lr"] = sel["lr"][method]
    out.update(sel.get("contrastive", {}).get(method, {}))
    if method == "t3ar":
        out.update(sel.get("t3ar_options", {}))
        out.update(dict(plan.options))
    return out


def frozen_retriever(sel: Mapping[str, Any]) -> str:
    """R as the method benchmark froze it (the grid protocol chooses it on validation), else the default."""
    return str(sel.get("validated", {}).get("retriever") or sel.get("retriever") or "efficientnet_lite0")

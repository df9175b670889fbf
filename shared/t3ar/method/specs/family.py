"""The T3AR family (:mod:`t3ar.method.contrastive`): memory bank, filtered pseudo-labels, InfoNCE with retrieved
pool negatives. ``t3ar`` retrieves each target image's nearest pool neighbours, ``t3ar-random`` draws them at
random (the control), ``t3ar-noretrieval`` reads no pool.

Their configs (:class:`FamilyConfig`: :class:`T3ARConfig` with a pool, :class:`T3ARNoRetrievalConfig` without) nest
the family's options in groups (sub-models), each checking its own interactions: retrieval, pool data and pool labels
(the methods with a pool), refinement, second stage and safeguards (SAR's, EATA's and WiSE-FT's
mechanisms: :mod:`t3ar.method.safeguards`), every one off by default. The switches no benchmark round kept are
the benchmarks' alone (:data:`t3ar.method.config.PROBE_SWITCHES`, set through :class:`t3ar.method.probe.Probe`).
The config checks the interactions across groups, and job sizing adds the second stage's steps and the Fisher
anchor's pass to the job's budget (:meth:`Options.added_steps`, :meth:`Options.added_passes`). A config may name a
preset (:mod:`t3ar.method.presets`) and may give its options flat, as earlier versions did (:attr:`T3ARConfig.FLAT`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from t3ar.method.config import (
    MAX_STEPS,
    ContrastiveConfig,
    Options,
    PoolUse,
    RetrievalOptions,
    nest,
)
from t3ar.method.presets import Preset, expand
from t3ar.method.registry import MethodSpec, register

STEP = "t3ar.method.contrastive:T3AR"
#: the anchor's weight when the config gives none: L2-SP's alpha / 2 (alpha = 0.1; its penalty is alpha/2 x the
#: squared distance), EATA's fisher_alpha
ANCHOR_WEIGHTS = {"l2": 0.05, "fisher": 2000.0}


class PoolDataOptions(Options):
    """Retrieved neighbours as pseudo-labelled data (off when ``weight`` is 0)."""

    weight: float = Field(
        default=0.0, ge=0, le=100, description="weight of the cross-entropy of confident, agreeing retrieved "
                                               "neighbours (weak view) against their own filtered pseudo-labels; "
                                               "0 = off (the paper)")
    threshold: float = Field(default=0.5, ge=0, le=1,
                             description="least max-softmax of a neighbour's filtered prediction")
    norm: Literal["running", "batch"] = Field(
        default="running", description="BatchNorm normalises them with the running (target) statistics, or with "
                                       "their own batch's (a few images of other domains); neither moves the "
                                       "running statistics")
    cap: int = Field(default=64, ge=1, le=1024, description="at most this many neighbours per step (most confident)")
    sources: tuple[str, ...] | None = Field(
        default=None, max_length=64, description="pool sources (the part of a pool id before its first '/') whose "
                                                 "items may serve as data; None = every source")


class PoolLabelOptions(Options):
    """Retrieved pool items that carry a label which is one of the model's classes train with that label (off when
    ``weight`` is 0); the rest stay contrastive negatives."""

    weight: float = Field(
        default=0.0, ge=0, le=100, description="weight of the cross-entropy of the retrieved neighbours that carry "
                                               "a pool label of one of the model's classes (weak views) against "
                                               "that label; 0 = off")
    cap: int = Field(default=64, ge=1, le=1024, description="at most this many per step (drawn at random among the "
                                                            "step's labelled neighbours when there are more)")
    balance: bool = Field(default=False, description="weight each class equally within a step (a retrieved set is "
                                                     "imbalanced); False = every labelled neighbour counts once")


class RefinementOptions(Options):
    """AdaContrast's pseudo-label refinement, at test time."""

    knn: bool = Field(default=False, description="each query's pseudo-label by soft k-NN voting: the mean class "
                                                 "probabilities of the `neighbors` bank entries nearest its "
                                                 "weak-view feature; False = the argmax of the mean logits stored "
                                                 "for its own id (the paper's filtered pseudo-label)")
    labelled: bool = Field(default=False, description="with knn: the bank's pool entries that carry a pool label of "
                                                      "one of the model's classes vote too, with that label "
                                                      "(one-hot); unlabelled pool entries never vote")
    neighbors: int = Field(default=10, ge=1, le=1024, description="soft-voting neighbours")

    @model_validator(mode="after")
    def _check(self) -> RefinementOptions:
        if self.labelled and not self.knn:
            raise ValueError("knn_refine_labelled lets labelled pool entries vote in the soft k-NN refinement: it "
                             "needs knn_refine")
        return self


class SecondStageOptions(Options):
    """A second, short stage: the bottleneck and head retrained on the target alone (SWAT)."""

    steps: int = Field(default=0, ge=0, le=MAX_STEPS,
                       description="steps of a second stage that retrains only the bottleneck and head on the target "
                                   "alone (true labels in train time, the filtered pseudo-labels in test time); "
                                   "0 = none")
    lr: float | None = Field(default=None, gt=0, le=10, description="the second stage's lr; None = the config's lr")

    def added_steps(self) -> int:
        return self.steps


class SafeguardOptions(Options):
    """Against self-training on wrong pseudo-labels: an anchor (L2-SP, EATA's Fisher) and WiSE-FT's interpolation;
    each off by default (reliable samples and the collapse fallback are the benchmarks' probe switches)."""

    anchor: Literal["l2", "fisher"] | None = Field(
        default=None, description="a penalty anchor_weight x sum F (theta - theta_0)^2 over the trainable "
                                  "parameters, theta_0 their values at the start (after the BatchNorm start); F = 1 "
                                  "('l2': L2-SP) or the Fisher diagonal of the model's own pseudo-labels on the "
                                  "target at the start ('fisher': EATA's, one more pass with gradient); None = none")
    anchor_weight: float | None = Field(
        default=None, gt=0, le=1e6, description="the anchor's weight; None = the paper's: 0.05 for 'l2' (L2-SP's "
                                                "alpha/2, alpha = 0.1), 2000 for 'fisher' (EATA's)")
    wise_alpha: float | None = Field(
        default=None, gt=0, le=1, description="after the run, each parameter becomes alpha x adapted + (1 - alpha) x "
                                              "start (WiSE-FT; start = the bn-adapt state's parameters, the job's "
                                              "start), then the target's BatchNorm statistics are re-estimated for "
                                              "them; None = off (1.0: the adapted)")

    @model_validator(mode="after")
    def _check(self) -> SafeguardOptions:
        if self.anchor_weight is not None and self.anchor is None:
            raise ValueError("anchor_weight is the anchor's weight: it needs anchor ('l2' or 'fisher')")
        return self

    def added_passes(self) -> int:
        """The Fisher anchor's estimate: one pass over the target with gradient before the first step."""
        return 1 if self.anchor == "fisher" else 0

    @property
    def resolved_anchor_weight(self) -> float:
        """The anchor's weight (0 without an anchor): ``anchor_weight``, or the paper's for ``anchor``."""
        if self.anchor is None:
            return 0.0
        return self.anchor_weight if self.anchor_weight is not None else ANCHOR_WEIGHTS[self.anchor]


def _flat(group: str, names: dict[str, str]) -> dict[str, tuple[str, str]]:
    return {flat: (group, name) for flat, name in names.items()}


class FamilyConfig(ContrastiveConfig):
    """The options every method of the T3AR family reads (see the module): its two configs,
    :class:`T3ARConfig` (the methods with a pool) and :class:`T3ARNoRetrievalConfig`, add their ``method``.
    Defaults follow the paper, scaled to a CPU budget."""

    FLAT: ClassVar[Mapping[str, tuple[str, str]]] = {
        **_flat("refinement", {"knn_refine": "knn", "knn_refine_labelled": "labelled",
                               "refine_neighbors": "neighbors"}),
        **_flat("second_stage", {"second_stage_steps": "steps", "second_stage_lr": "lr"}),
        **_flat("safeguards", {n: n for n in SafeguardOptions.model_fields}),
    }

    preset: Preset | None = Field(
        default=None, description="a named configuration of the family (t3ar.method.presets): 'paper' (these "
                                  "defaults) or 'validated' (what the method benchmark froze on validation); its "
                                  "options go under the ones given (those of them the method has); None = none")
    refinement: RefinementOptions = RefinementOptions()
    second_stage: SecondStageOptions = SecondStageOptions()
    safeguards: SafeguardOptions = SafeguardOptions()
    cpu_bf16_nograd: bool = Field(
        default=False, description="an approximation, CPU only: the no-gradient passes (keys, pool features, bank "
                                   "initialisation) under bfloat16 autocast. Fast where the CPU has native bf16 "
                                   "(AMX / AVX512-BF16), slow elsewhere; off by default")
    joint_pass: bool | None = Field(
        default=None, description="forward the weak views (with gradient) together with the strong views and "
                                  "neighbours (without) as one batch, each part with its own BatchNorm statistics: "
                                  "the same results with one forward less per step, at the price of a backward over "
                                  "every row; None = on CUDA only (where a step waits on kernel launches, not "
                                  "arithmetic) and never with the EMA teacher")

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        return nest(cls, expand(data, accepted={*cls.model_fields, *cls.FLAT}))

    @model_validator(mode="after")
    def _across_groups(self) -> FamilyConfig:
        if self.joint_pass and self.cpu_bf16_nograd:
            raise ValueError("joint_pass and cpu_bf16_nograd cannot be combined: the approximation runs the "
                             "no-gradient passes apart, in bfloat16")
        return self

    @property
    def pool_as_data(self) -> bool:
        """Retrieved neighbours serve as pseudo-labelled training data (a retrieval method with a data weight)."""
        return False

    @property
    def pool_labels_as_data(self) -> bool:
        """Retrieved neighbours that carry a pool label serve as labelled training data."""
        return False

    @property
    def resolved_anchor_weight(self) -> float:
        return self.safeguards.resolved_anchor_weight


class T3ARConfig(FamilyConfig):
    """The config of the family's methods with a pool (``t3ar``, ``t3ar-random``): the family's options and how
    the pool serves (retrieval, pool data, pool labels)."""

    FLAT: ClassVar[Mapping[str, tuple[str, str]]] = {
        **_flat("retrieval", {n: n for n in RetrievalOptions.model_fields}),
        **_flat("pool_data", {"pool_data_weight": "weight", "pool_data_threshold": "threshold",
                              "pool_data_norm": "norm", "pool_data_cap": "cap", "pool_data_sources": "sources"}),
        **_flat("pool_labels", {"pool_label_weight": "weight", "pool_label_cap": "cap",
                                "pool_label_balance": "balance"}),
        **FamilyConfig.FLAT,
    }

    method: Literal["t3ar", "t3ar-random"] = "t3ar"
    retrieval: RetrievalOptions = RetrievalOptions()
    pool_data: PoolDataOptions = PoolDataOptions()
    pool_labels: PoolLabelOptions = PoolLabelOptions()

    @property
    def retrieval_options(self) -> RetrievalOptions | None:
        return self.retrieval

    @property
    def pool_as_data(self) -> bool:
        return self.pool_data.weight > 0

    @property
    def pool_labels_as_data(self) -> bool:
        return self.pool_labels.weight > 0

    def pool_use(self) -> PoolUse:
        """Neighbours as data (restricted to ``pool_data.sources``), and the pool labels for labelled neighbours
        as data or for false negatives told by their label."""
        base = super().pool_use()
        return PoolUse(as_data=self.pool_as_data, labels=base.labels or self.pool_labels_as_data,
                       sources=self.pool_data.sources if self.pool_as_data else None)


class T3ARNoRetrievalConfig(FamilyConfig):
    """``t3ar-noretrieval``'s config: the family's options without a pool (no retrieval, pool data or pool labels
    group; a preset's pool options do not apply)."""

    method: Literal["t3ar-noretrieval"] = "t3ar-noretrieval"

    @model_validator(mode="after")
    def _no_pool(self) -> T3ARNoRetrievalConfig:
        if self.refinement.labelled:
            raise ValueError("refinement.labelled lets labelled pool entries vote: t3ar-noretrieval reads no pool "
                             "(a method with a pool: t3ar, t3ar-random)")
        return self


register(MethodSpec("t3ar-noretrieval", "the T3AR family without a pool", step=STEP, family=True,
                    config=T3ARNoRetrievalConfig))
register(MethodSpec("t3ar-random", "the T3AR family, random pool neighbours (the control)", step=STEP,
                    retrieval="random", family=True, config=T3ARConfig))
register(MethodSpec("t3ar", "T3AR: retrieved pool neighbours as InfoNCE negatives", step=STEP, retrieval="nearest",
                    family=True, config=T3ARConfig))

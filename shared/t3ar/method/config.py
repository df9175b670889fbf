"""The adaptation config: one frozen model, carried in the job and saved inside the checkpoint.

Which methods exist, and what each is (retrieval, train mode, the T3AR family), is the method registry's
(:mod:`t3ar.method.registry`): ``method`` names one of its methods, and the properties below read its spec. A
method's groups of options check their own interactions (the T3AR family's: :mod:`t3ar.method.specs.family`);
the checks here are those of every method. This module stays free of torch: the services validate configs with it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from t3ar.method import registry
from t3ar.method.presets import Preset, expand

#: what the T3AR family does with a retrieved neighbour that the model predicts in the query's own (pseudo-)class:
#: keep it as a negative (the paper), mask it out of the negatives, or make it a positive
FalseNegatives = Literal["keep", "mask", "positive"]
#: upper bounds of the config's open-ended fields (issue 29): what a job may ask for at all; operators cap steps,
#: wall time and memory per job lower in the API's settings
MAX_STEPS = 1_000_000
MAX_BANK_SIZE = 262_144
MAX_SEED = 2**32 - 1
MAX_WEIGHT = 1000.0
#: the anchor's weight when the config gives none: L2-SP's alpha / 2 (alpha = 0.1; its penalty is alpha/2 x the
#: squared distance), EATA's fisher_alpha
ANCHOR_WEIGHTS = {"l2": 0.05, "fisher": 2000.0}
#: the loops' switch for views made one step ahead (t3ar.method.ahead), in every training config
ViewsAhead = Annotated[bool | None, Field(
    description="make the next batch's views on a background thread while the current step runs (the same "
                "results either way); None = on the CPU and CUDA")]


class AdaptConfig(BaseModel):
    """Every knob of an adaptation run. Defaults follow the paper/AdaContrast, scaled to a CPU budget.

    ``mode='test'``: T is unlabelled; the loss uses filtered pseudo-labels. ``mode='train'``: T is labelled
    (train-time adaptation); true labels replace pseudo-labels in the CE loss and the negative mask.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: str = Field(
        default="t3ar", json_schema_extra=lambda schema: schema.update(enum=list(registry.names())),
        description="the adaptation method: a name of the method registry (t3ar.method.registry)")
    preset: Preset | None = Field(
        default=None, description="a named configuration of the T3AR family (t3ar.method.presets): 'paper' (these "
                                  "defaults) or 'validated' (what the method benchmark froze on validation); its "
                                  "options go under the ones given; None = none")
    mode: Literal["test", "train"] = "test"
    # retrieval
    k: int = Field(default=5, ge=0, le=64, description="retrieved pool neighbours per target image")
    r: int = Field(default=5, ge=1, le=20, description="dedup: sample k of the top r*k neighbours")
    redraw_neighbours: bool = Field(
        default=False, description="re-sample k of the top r*k neighbours at every visit (the paper's sampling); "
                                   "False = drawn once per job")
    pool_negatives: Literal["own", "all"] = Field(
        default="own", description="own: a query's negatives from A are its own retrieved neighbours in the bank; "
                                   "all: every pool entry in the bank")
    dedup_threshold: float | None = Field(
        default=None, gt=0, le=1, description="drop candidates whose retriever similarity to the query is >= this "
                                              "(near-duplicates) before sampling")
    false_negatives: FalseNegatives = Field(
        default="keep", description="a retrieved neighbour whose filtered pseudo-label is the query's (pseudo-)label: "
                                    "keep it as a negative (the paper), mask it out of the query's negatives, or "
                                    "make it a positive of the query")
    # neighbours as data (off when pool_data_weight is 0)
    pool_data_weight: float = Field(
        default=0.0, ge=0, le=100, description="neighbours as data: weight of the cross-entropy of confident, "
                                               "agreeing retrieved neighbours (weak view) against their own filtered "
                                               "pseudo-labels; 0 = off (the paper)")
    pool_data_threshold: float = Field(
        default=0.5, ge=0, le=1, description="neighbours as data: least max-softmax of a neighbour's filtered "
                                             "prediction")
    pool_data_norm: Literal["running", "batch"] = Field(
        default="running", description="neighbours as data: BatchNorm normalises them with the running (target) "
                                       "statistics, or with their own batch's (a few images of other domains); "
                                       "neither moves the running statistics")
    pool_data_cap: int = Field(default=64, ge=1, le=1024,
                               description="neighbours as data: at most this many neighbours per step (most confident)")
    pool_data_sources: tuple[str, ...] | None = Field(
        default=None, max_length=64, description="neighbours as data: pool sources (the part of a pool id before its "
                                                 "first '/') whose items may serve as data; None = every source")
    # labelled neighbours as data (off when pool_label_weight is 0): retrieved pool items that carry a label which
    # is one of the model's classes train with that label (issue 33); the rest stay contrastive negatives
    pool_label_weight: float = Field(
        default=0.0, ge=0, le=100, description="labelled neighbours as data: weight of the cross-entropy of the "
                                               "retrieved neighbours that carry a pool label of one of the model's "
                                               "classes (weak views) against that label; 0 = off")
    pool_label_cap: int = Field(default=64, ge=1, le=1024,
                                description="labelled neighbours as data: at most this many per step (drawn at "
                                            "random among the step's labelled neighbours when there are more)")
    pool_label_balance: bool = Field(
        default=False, description="labelled neighbours as data: weight each class equally within a step (a "
                                   "retrieved set is imbalanced); False = every labelled neighbour counts once")
    # BatchNorm statistics (the T3AR family; issue 33's 'no harm' options)
    bn_start: bool = Field(
        default=False, description="T3AR family: set the target's BatchNorm statistics first (what bn-adapt does, "
                                   "same layers as train_groups), then train")
    bn_fixed: bool = Field(
        default=False, description="T3AR family: every BatchNorm layer normalises with its running statistics "
                                   "during the steps and never updates them (with bn_start: bn-adapt's, kept)")
    teacher_ema: float = Field(
        default=0.0, ge=0, lt=1, description="T3AR family: keys, pool features and the logits behind the filtered "
                                             "pseudo-labels come from an EMA teacher of the model with this momentum "
                                             "(AdaContrast's 0.999); 0 = the current model (the paper's m = 0)")
    # AdaContrast's pseudo-label refinement, for the T3AR family (issue 33)
    knn_refine: bool = Field(
        default=False, description="T3AR family, test time: each query's pseudo-label by soft k-NN voting "
                                   "(AdaContrast's refinement): the mean class probabilities of the refine_neighbors "
                                   "bank entries nearest its weak-view feature; False = the argmax of the mean "
                                   "logits stored for its own id (the paper's filtered pseudo-label)")
    knn_refine_labelled: bool = Field(
        default=False, description="with knn_refine: the bank's pool entries that carry a pool label of one of the "
                                   "model's classes vote too, with that label (one-hot); unlabelled pool entries "
                                   "never vote")
    # a second, short stage: the bottleneck and head retrained on the target alone (SWAT)
    second_stage_steps: int = Field(
        default=0, ge=0, le=MAX_STEPS, description="T3AR family: steps of a second stage that retrains only the "
                                                   "bottleneck and head on the target alone (true labels in train "
                                                   "time, the filtered pseudo-labels in test time); 0 = none")
    second_stage_lr: float | None = Field(default=None, gt=0, le=10,
                                          description="the second stage's lr; None = lr")
    # safeguards against self-training on wrong pseudo-labels (SAR, EATA, WiSE-FT: t3ar.method.safeguards)
    reliable_entropy: float | None = Field(
        default=None, gt=0, le=1, description="T3AR family, test time: the cross-entropy counts only the samples "
                                              "whose prediction entropy (weak view) is under this x ln C (SAR and "
                                              "EATA: 0.4); None = every sample")
    reliable_reweight: bool = Field(
        default=False, description="with reliable_entropy: weight each reliable sample by 1 / exp(H - E0), "
                                   "E0 = reliable_entropy x ln C (EATA)")
    anchor: Literal["l2", "fisher"] | None = Field(
        default=None, description="T3AR family: a penalty anchor_weight x sum F (theta - theta_0)^2 over the "
                                  "trainable parameters, theta_0 their values at the start (after bn_start); "
                                  "F = 1 ('l2': L2-SP) or the Fisher diagonal of the model's own pseudo-labels "
                                  "on the target at the start ('fisher': EATA's, one more pass with gradient); "
                                  "None = none")
    anchor_weight: float | None = Field(
        default=None, gt=0, le=1e6, description="the anchor's weight; None = the paper's: 0.05 for 'l2' (L2-SP's "
                                                "alpha/2, alpha = 0.1), 2000 for 'fisher' (EATA's)")
    collapse_fallback: float | None = Field(
        default=None, gt=0, lt=1, description="T3AR family, test time: when the entropy of the class histogram of "
                                              "the job's pseudo-labels falls under this fraction of its start "
                                              "value, restore the bn-adapt state and end the job (the report says "
                                              "at which step); None = off")
    wise_alpha: float | None = Field(
        default=None, gt=0, le=1, description="T3AR family: after the run, each parameter becomes alpha x adapted "
                                              "+ (1 - alpha) x start (WiSE-FT; start = the bn-adapt state's "
                                              "parameters, the job's start), then the target's BatchNorm "
                                              "statistics are re-estimated for them; None = off (1.0: the adapted)")
    # schedule
    epochs: int = Field(default=10, ge=1, le=1000)
    min_steps: int = Field(default=0, ge=0, le=MAX_STEPS,
                           description="lower bound on optimiser steps (tiny fractions of T)")
    batch_size: int = Field(default=32, ge=2, le=4096)
    lr: float = Field(default=0.001, gt=0, le=10)
    momentum: float = Field(default=0.9, ge=0, lt=1)
    weight_decay: float = Field(default=1e-4, ge=0, le=1)
    warmup_frac: float = Field(default=0.1, ge=0, lt=1, description="fraction of steps of linear warm-up")
    # losses
    temperature: float = Field(default=0.07, gt=0, le=100)
    ce_weight: float = Field(default=1.0, ge=0, le=MAX_WEIGHT)
    contrastive_weight: float = Field(default=1.0, ge=0, le=MAX_WEIGHT)
    diversity_weight: float | None = Field(
        default=None, ge=0, le=MAX_WEIGHT,
        description="diversity term weight; None = the method's own (AdaContrast 1, else 0)")
    bank_size: int = Field(default=16384, ge=8, le=MAX_BANK_SIZE, description="memory bank / MoCo queue entries")
    # AdaContrast (its published defaults)
    ema: float = Field(default=0.999, ge=0, lt=1, description="AdaContrast: key-encoder momentum")
    refine_neighbors: int = Field(default=10, ge=1, le=1024,
                                  description="soft-voting neighbours (AdaContrast; the T3AR family with knn_refine)")
    # what trains
    train_groups: int | None = Field(default=2, ge=0, le=64,
                                     description="last N backbone groups that train; None=all")
    # data
    fraction: float = Field(default=1.0, gt=0, le=1)
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    amp: bool = Field(default=True, description="mixed precision on CUDA (ignored on CPU)")
    views_ahead: ViewsAhead = None
    cpu_bf16_nograd: bool = Field(
        default=False, description="an approximation, CPU only (T3AR family): the no-gradient passes (keys, pool "
                                   "features, bank initialisation) under bfloat16 autocast. Fast where the CPU has "
                                   "native bf16 (AMX / AVX512-BF16), slow elsewhere; off by default")
    joint_pass: bool | None = Field(
        default=None, description="T3AR family: forward the weak views (with gradient) together with the strong "
                                  "views and neighbours (without) as one batch, each part with its own BatchNorm "
                                  "statistics: the same results with one forward less per step, at the price of "
                                  "a backward over every row; None = on CUDA only (where a step waits on kernel "
                                  "launches, not arithmetic) and never with teacher_ema")

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        return expand(data) if isinstance(data, dict) else data

    @field_validator("method")
    @classmethod
    def _known(cls, name: str) -> str:
        registry.get(name)  # ValueError naming the registered methods
        return name

    @model_validator(mode="after")
    def _check(self) -> AdaptConfig:
        spec = self.spec
        if self.uses_retrieval and self.k < 1:
            raise ValueError(f"method {self.method} retrieves neighbours: k must be >= 1")
        if self.joint_pass and self.cpu_bf16_nograd:
            raise ValueError("joint_pass and cpu_bf16_nograd cannot be combined: the approximation runs the "
                             "no-gradient passes apart, in bfloat16")
        mine = {option for group in spec.groups for option in group.own}
        owners = {o: m for o, m in registry.owned_options().items() if o not in mine and getattr(self, o, None)}
        if owners:  # another method's own options, set
            methods = sorted({m for ms in owners.values() for m in ms}, key=registry.names().index)
            whose = (f"the T3AR family ({', '.join(methods)})" if all(registry.get(m).family for m in methods)
                     else ", ".join(methods))
            raise ValueError(f"{', '.join(owners)} {'is an option' if len(owners) == 1 else 'are options'} of "
                             f"{whose}, not of {self.method}")
        spec.check(self)  # the method's groups of options, each its own interactions
        if self.mode == "train" and not self.has_train_mode:
            raise ValueError(f"{self.method} is a test-time method (no labels); use a method with a train-time "
                             f"mode ({', '.join(n for n in registry.names() if registry.get(n).train_mode)}) "
                             "with mode 'train'")
        return self

    @property
    def pool_as_data(self) -> bool:
        """Retrieved neighbours serve as pseudo-labelled training data (a retrieval method with a data weight)."""
        return self.uses_retrieval and self.pool_data_weight > 0

    @property
    def pool_labels_as_data(self) -> bool:
        """Retrieved neighbours that carry a pool label serve as labelled training data."""
        return self.uses_retrieval and self.pool_label_weight > 0

    @property
    def resolved_anchor_weight(self) -> float:
        """The anchor's weight (0 without an anchor): ``anchor_weight``, or the paper's for ``anchor``."""
        if self.anchor is None:
            return 0.0
        if self.anchor_weight is not None:
            return self.anchor_weight
        return ANCHOR_WEIGHTS[self.anchor]

    @property
    def spec(self) -> registry.MethodSpec:
        """The registry's declaration of :attr:`method`."""
        return registry.get(self.method)

    @property
    def in_family(self) -> bool:
        """The T3AR family (bank, filtered pseudo-labels, InfoNCE): the options above apply to it only."""
        return self.spec.family

    @property
    def uses_retrieval(self) -> bool:
        return self.spec.retrieval is not None

    @property
    def has_train_mode(self) -> bool:
        return self.spec.train_mode

    @property
    def resolved_diversity_weight(self) -> float:
        if self.diversity_weight is not None:
            return self.diversity_weight
        return self.spec.diversity_weight

"""The method benchmark's plans (``t3ar bench adapt --plan quick|cpu|paper``) and its paired statistics.

Protocol (the method issue): every hyper-parameter is chosen on a *validation shift* (Google -> Fluent 3D)
and frozen; results are reported on the other shifts. Each (shift, seed, fraction) cell is paired: every
arm sees the same source model, the same subset, batch order, target views and bank initialisation
(separate random streams, :func:`t3ar.method.base.stream`), so method differences are paired per seed and
reported with 95 % confidence intervals (Student t over seeds).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

VALIDATION_SHIFT = "fluent3d"
EVAL_SHIFTS: tuple[str, ...] = ("twitter", "openmoji", "openmoji-black")
#: the cpu plan's evaluation shifts: every kit and archive style outside the source's artwork family (noto) and the
#: validation shifts' (fluent), one shift per artwork (the archive's twemoji and openmoji-iconify are the kit's
#: twitter and openmoji), line art and monochrome included (named here, not imported: see EMOJI_SOURCES; a unit
#: test checks the families with t3ar.datakit.archive.family_of)
WIDE_EVAL_SHIFTS: tuple[str, ...] = ("twitter", "openmoji", "openmoji-black", "noto-v1", "emojione",
                                     "emojione-monotone", "emojione-v1", "fxemoji", "streamline-emojis")
#: the cpu plan's second validation shift: Fluent's high-contrast monochrome, where the base model is weak (the
#: first, fluent3d, is where it is usable); validation chooses by the worse of the two
WEAK_VALIDATION_SHIFT = "fluent-emoji-high-contrast"
#: acceptance holdouts: labelled images per class taken from the adaptation part, outside the adapted subset
HOLDOUT_PER_CLASS: tuple[int, ...] = (1, 2, 4)
TEST_METHODS: tuple[str, ...] = ("source", "tent", "shot-im", "adacontrast", "t3ar-noretrieval", "t3ar-random",
                                 "t3ar")
#: train-time arms: supervised fine-tuning on the labelled subset, and the T3AR family with labels
TRAIN_METHODS: tuple[str, ...] = ("supervised", "t3ar-noretrieval", "t3ar-random", "t3ar")
#: the methods with a contrastive term (the T3AR family): the only term through which retrieval acts
CONTRASTIVE: tuple[str, ...] = ("t3ar-noretrieval", "t3ar-random", "t3ar")
#: a setting of the contrastive term: AdaptConfig fields and values, as pairs (hashable); () = AdaptConfig's own
Setting = tuple[tuple[str, Any], ...]
#: one-at-a-time variations of the T3AR family's contrastive term around AdaptConfig's defaults (InfoNCE weight 1
#: against cross-entropy weight 1, temperature 0.07); each method and mode keeps the best on validation at its
#: chosen lr, the default on a tie
CONTRASTIVE_SETTINGS: tuple[Setting, ...] = ((("contrastive_weight", 0.3),), (("contrastive_weight", 3.0),),
                                             (("temperature", 0.2),), (("temperature", 0.5),))
#: the pool's emoji styles (every style but the source's; a shift's own style is never in its pool): the sources an
#: operator knows to be of the target's kind, the only ones that may serve as data in one candidate
#: (named here, not imported: the CLI imports this module and must not load torch through the data kit; a unit test
#: keeps it equal to the kit's styles but the source's)
EMOJI_SOURCES: tuple[str, ...] = ("twitter", "openmoji", "openmoji-black", "fluent3d")
#: the labelled archive's styles in the cpu plan's pool (named here, not imported: see EMOJI_SOURCES; a unit test
#: keeps it equal to t3ar_bench.method.labelled_pool.ARCHIVE_POOL_STYLES)
ARCHIVE: tuple[str, ...] = ("noto", "noto-v1", "emojione", "emojione-monotone", "emojione-v1", "fxemoji",
                            "streamline-emojis", "fluent-emoji", "fluent-emoji-high-contrast")
#: the retrieval options the validated T3AR may keep (each off by default in AdaptConfig), tried in this order
RETRIEVAL_OPTIONS: tuple[tuple[str, Setting], ...] = (
    ("neighbours as data (weight 1, threshold 0.5)", (("pool_data_weight", 1.0),)),
    ("neighbours as data from the emoji sources only",
     (("pool_data_weight", 1.0), ("pool_data_sources", EMOJI_SOURCES))),
    ("neighbours as data: threshold 0.8", (("pool_data_weight", 1.0), ("pool_data_threshold", 0.8))),
    ("plain top-k (r = 1)", (("r", 1),)),
    ("false negatives masked", (("false_negatives", "mask"),)),
    ("false negatives as positives", (("false_negatives", "positive"),)),
)
#: the T3AR family's 'no harm' options, tried greedily on validation on top of the validated T3AR, in this
#: order: BatchNorm statistics from the target first (bn-adapt) and then moving or fixed, an EMA teacher, a lower lr,
#: SWAT's second stage (bottleneck and head on the target's filtered pseudo-labels), AdaContrast's soft k-NN voting,
#: then the safeguards (t3ar.method.safeguards, the papers' values): SAR's / EATA's reliable samples, an anchor to
#: the start weights (L2-SP, EATA's Fisher), a fallback to the bn-adapt state on collapse, WiSE-FT's interpolation
NO_HARM_OPTIONS: tuple[tuple[str, Setting], ...] = (
    ("bn-adapt first, statistics moving", (("bn_start", True),)),
    ("bn-adapt first, statistics fixed", (("bn_start", True), ("bn_fixed", True))),
    ("EMA teacher for keys and pseudo-labels (m = 0.999, AdaContrast's)", (("teacher_ema", 0.999),)),
    ("lr a third of the family's", (("lr", "third"),)),
    ("second stage: 10 steps of bottleneck and head on the target alone", (("second_stage_steps", 10),)),
    ("soft k-NN voting for the pseudo-labels (AdaContrast's, 10 neighbours)", (("knn_refine", True),)),
    ("reliable samples only in the cross-entropy (entropy under 0.4 ln C: SAR's and EATA's)",
     (("reliable_entropy", 0.4),)),
    ("reliable samples, re-weighted by 1 / exp(H - E0) (EATA's)",
     (("reliable_entropy", 0.4), ("reliable_reweight", True))),
    ("L2-SP anchor to the start weights (weight 0.05: L2-SP's alpha 0.1)", (("anchor", "l2"),)),
    ("Fisher anchor to the start weights (EATA's, weight 2000)", (("anchor", "fisher"),)),
    ("collapse fallback to the bn-adapt state (pseudo-labels' class entropy under half its start)",
     (("collapse_fallback", 0.5),)),
    ("WiSE-FT: weights halfway between the bn-adapt start and the adapted (alpha 0.5)", (("wise_alpha", 0.5),)),
)
#: labelled neighbours as data: tried greedily on validation after weight 1 (the start)
LABEL_OPTIONS: tuple[tuple[str, Setting], ...] = (
    ("labelled weight 2", (("pool_label_weight", 2.0),)),
    ("class-balanced labelled term", (("pool_label_balance", True),)),
    ("second stage: 10 steps of bottleneck and head on the target alone", (("second_stage_steps", 10),)),
    ("labelled neighbours vote in the soft k-NN pseudo-label refinement",
     (("knn_refine", True), ("knn_refine_labelled", True))),
)
#: the T3AR family's contrastive-term candidates of the grid protocol (besides AdaptConfig's own), one at a time
FAMILY_TERMS: tuple[Setting, ...] = ((("temperature", 0.2),), (("temperature", 0.5),), (("diversity_weight", 1.0),))
#: the retrievers the CPU plan compares (the packaged ImageNet EfficientNet-Lites)
LITES: tuple[str, ...] = ("efficientnet_lite0", "efficientnet_lite1", "efficientnet_lite2")


@dataclass(frozen=True)
class BenchPlan:
    """Everything one plan decides. Hyper-parameters not listed are ``AdaptConfig`` defaults."""

    name: str
    eval_shifts: tuple[str, ...] = EVAL_SHIFTS
    validation_shift: str = VALIDATION_SHIFT
    #: more validation shifts (:func:`validation_shifts`): with any, every choice is made by the worst of them
    extra_validation_shifts: tuple[str, ...] = ()
    #: the acceptance holdouts' sizes (labelled images per class from the adaptation part, never adapted on):
    #: every test-time run evaluates its model on each, and the report picks a winner on the first
    holdout_per_class: tuple[int, ...] = HOLDOUT_PER_CLASS
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    fractions: tuple[float, ...] = (0.1, 0.3, 1.0)  # of the adaptation part (35 % of each target class)
    low_fractions: tuple[float, ...] = (0.1, 0.3)  # the low-data cells the goal is about
    methods: tuple[str, ...] = TEST_METHODS
    train_methods: tuple[str, ...] = TRAIN_METHODS
    train_fractions: tuple[float, ...] = (0.1, 0.3, 1.0)
    epochs: int = 30  # the paper's test-time schedule
    max_steps: int | None = None  # cap on optimiser steps per run (CPU plans); None = epochs decide
    min_steps: int = 10
    batch_size: int = 32
    warmup_frac: float = 4 / 30  # the paper: 4 warm-up epochs of 30
    lr_grid: tuple[float, ...] = (2e-4, 1e-3, 3.125e-3)  # 3.125e-3 = the paper's 0.1 at batch 1024, scaled to 32
    # candidates for the T3AR family's contrastive term, besides the default (the lr grid runs at the default)
    contrastive_settings: tuple[Setting, ...] = CONTRASTIVE_SETTINGS
    select_fraction: float = 0.3
    select_seeds: tuple[int, ...] = (0, 1)
    options: tuple[tuple[str, Any], ...] = (("redraw_neighbours", True), ("pool_negatives", "all"))
    ablation_fraction: float = 0.3
    k: int = 5
    image_size: int = 64
    eval_share: float = 0.65
    split_seed: int = 0
    max_adapt: int | None = None  # caps (quick only)
    max_eval: int | None = None
    source_epochs: int = 6
    source_lr: float = 0.02
    train_groups: int = 2
    retriever_size: int = 96
    #: the retrievers R the plan embeds the pool with (backbone presets); the first is the default (the paper-
    #: faithful arms'), the validated T3AR takes the one with the best retrieval quality on the validation shift
    retrievers: tuple[str, ...] = ("efficientnet_lite0",)
    #: bn-adapt's candidates on validation: the last N backbone groups whose BatchNorm layers adapt (None = all)
    bn_groups: tuple[int | None, ...] = (2, None)
    #: the validated T3AR's retrieval options, tried greedily in this order on validation (name, AdaptConfig pairs)
    retrieval_options: tuple[tuple[str, Setting], ...] = RETRIEVAL_OPTIONS
    pool_cap: int | None = None
    #: the labelled-pool protocol (:mod:`t3ar_bench.method.labelled`): the family's no-harm options and
    #: labelled neighbours chosen on validation, the labelled arms and their controls in the grid, the goals
    labelled: bool = False
    no_harm_options: tuple[tuple[str, Setting], ...] = NO_HARM_OPTIONS
    label_options: tuple[tuple[str, Setting], ...] = LABEL_OPTIONS
    whole_pool_fractions: tuple[float, ...] = (0.3,)  # where the whole-labelled-pool reference runs (its cost)
    #: labelled emoji archive styles in the pool (t3ar.datakit.archive; the target's and the source's artwork
    #: families kept out per shift, t3ar_bench.method.labelled_pool.pool_names); () = the kit's styles only
    archive_styles: tuple[str, ...] = ()
    #: grid arms not run (test-time labels of grid.TEST_ARMS / ORACLE; train-time of grid.TRAIN_ARMS)
    grid_skip: tuple[str, ...] = ()
    train_skip: tuple[str, ...] = ()
    curves: bool = True  # per-epoch diagnostics of the contrastive methods (seed 0, select fraction)
    workers: int = 1  # parallel run processes (GPU plans: the device is mostly idle at these sizes)
    notes: tuple[str, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


QUICK = BenchPlan(name="quick", eval_shifts=("twitter",), seeds=(0, 1), fractions=(0.3,), low_fractions=(0.3,),
                  train_fractions=(0.3,), epochs=2, max_steps=8, min_steps=4, lr_grid=(1e-3,),
                  contrastive_settings=((("temperature", 0.5),),), select_seeds=(0,), bn_groups=(2,),
                  retrievers=("efficientnet_lite0", "efficientnet_lite1"),
                  retrieval_options=(RETRIEVAL_OPTIONS[0], RETRIEVAL_OPTIONS[4]),
                  max_adapt=160, max_eval=240, source_epochs=1, pool_cap=150,
                  options=(("pool_negatives", "all"),), labelled=True,
                  no_harm_options=(NO_HARM_OPTIONS[1], NO_HARM_OPTIONS[3]), label_options=(LABEL_OPTIONS[1],),
                  grid_skip=("tent", "shot-im"),
                  notes=("smoke run: shows the pipeline works; not results",))
#: the cpu plan of the acceptance round: every style outside the source's and the validation shifts' families, two
#: validation shifts (one where the base model is weak), 3 seeds, 10 % and 30 %, test time only; the arms: source,
#: bn-adapt, the validated T3AR (the default), T3AR with the labelled pool and its class-matched random control,
#: SAR and EATA when the method registry has them, and the acceptance winner among source / bn-adapt / the default
#: on a labelled holdout (from the runs' holdout scores: no extra runs)
CPU = BenchPlan(name="cpu", eval_shifts=WIDE_EVAL_SHIFTS, extra_validation_shifts=(WEAK_VALIDATION_SHIFT,),
                seeds=(0, 1, 2), fractions=(0.1, 0.3), train_fractions=(), epochs=30, max_steps=40,
                lr_grid=(1e-3, 3e-3), contrastive_settings=FAMILY_TERMS, retrievers=("efficientnet_lite0",),
                workers=2, labelled=True, curves=False, whole_pool_fractions=(),
                grid_skip=("tent", "shot-im", "adacontrast", "t3ar-noretrieval", "oracle", "t3ar-paper"),
                train_skip=("t3ar-paper", "t3ar-noretrieval"), archive_styles=ARCHIVE,
                notes=("the acceptance round: 9 evaluation shifts (every kit and archive style outside the source's "
                       "and the validation shifts' artwork families), validation on fluent3d and Fluent high-contrast "
                       "by the worse of the two, 3 seeds, paired CIs over shifts x seeds; test time only; AdaContrast "
                       "is validated (a candidate for the default) but not in the grid; the whole-pool reference, "
                       "TENT, SHOT-IM, the retrieval-off twin and the paper-faithful arm are not re-run (earlier runs "
                       "in git history have them)",
                       "the low-data fractions, at most 40 optimiser steps per run (36 at 30 %: 6 epochs; 40 at 10 %: "
                       "20 epochs), two single-thread processes on 2 cores: the step budget is what fits the time. A "
                       "probe on the validation shift before this protocol existed (30 %, seeds 0-1, 60 steps) gave "
                       "T3AR without retrieval 50.1 % at lr 1e-3 and 47.5 % at 3e-3, bn-adapt 50.0 %, training every "
                       "group 38 %: "
                       "more steps did not let the losses beat BatchNorm statistics there",
                       "the labelled pool: the clipart (unlabelled), the kit's emoji styles and the labelled archive's "
                       "styles, less the target's and the source's artwork families (the validation styles stay in "
                       "the evaluation shifts' pools: they are no evaluation labels); R is Lite0",))
PAPER = BenchPlan(name="paper", workers=12, retrievers=LITES, contrastive_settings=FAMILY_TERMS,
                  notes=("the paper's 30-epoch schedule; on one H100 with 12 run processes the low-data cells "
                         "(--fractions 0.1,0.3) took about 20 minutes before the contrastive term was chosen on "
                         "validation (48 more validation runs, 15 cross-entropy-only and 15 retrieval-off ablation "
                         "runs, about 16,000 steps: roughly 4 minutes more at that rate, not measured), and the "
                         "whole grid has about 2.5 times as many steps",))
#: a diagnostic, not a result: why the contrastive loop drifts on twitter at the paper's 30 epochs (per-epoch
#: held-out accuracy, pseudo-label accuracy, loss terms, pool share), at the lr the drift was seen with and one
#: 5x lower; nothing is chosen from it
DRIFT = BenchPlan(name="drift", eval_shifts=("twitter",), seeds=(0,), fractions=(0.3,), low_fractions=(0.3,), workers=2,
                  methods=("source", "t3ar-noretrieval", "t3ar"), lr_grid=(1e-3, 2e-4), epochs=30,
                  select_seeds=(0,),
                  notes=("diagnostic study of the drift at 30 epochs on one evaluation shift; nothing is chosen "
                         "from it",))
#: a diagnostic, not a result: the contrastive term (the one retrieval acts through) on every evaluation shift:
#: the cross-entropy alone, the default term and the term as the validation shift chose it, each with and without
#: retrieval; the choice is made on validation as in the other plans, nothing is chosen from the evaluation shifts
CONTRASTIVE_STUDY = BenchPlan(
    name="contrastive", fractions=(0.3,), low_fractions=(0.3,), workers=2,
    methods=("source", "t3ar-noretrieval", "t3ar"), train_methods=(), train_fractions=(), lr_grid=(2e-4,), options=(),
    curves=False,
    notes=("diagnostic study of the contrastive term at the paper's 30 epochs and 30 % of each shift, at the lr the "
           "validation shift chose for the T3AR family in the paper plan (2e-4); its setting is chosen on "
           "validation, nothing from the evaluation shifts",))
PLANS = {p.name: p for p in (QUICK, CPU, PAPER, DRIFT, CONTRASTIVE_STUDY)}


def validation_shifts(plan: BenchPlan) -> tuple[str, ...]:
    """Every validation shift of ``plan``: its ``validation_shift`` first, then the extra ones."""
    return (plan.validation_shift, *(s for s in plan.extra_validation_shifts if s != plan.validation_shift))


def _t_cdf(t: float, df: int) -> float:
    """CDF of Student's t (Simpson's rule on the density; accurate to ~1e-7 for the quantiles we need)."""
    if t < 0:
        return 1.0 - _t_cdf(-t, df)
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    n = 2000
    h = t / n
    f = [c * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(n + 1)]
    area = h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))
    return 0.5 + area


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on :func:`_t_cdf`)."""
    lo, hi = 0.0, 1000.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if _t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def paired(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """Mean of the per-seed differences a - b with its 95 % confidence interval (t over seeds)."""
    if len(a) != len(b):
        raise ValueError("paired samples need the same seeds")
    d = [x - y for x, y in zip(a, b, strict=True)]
    n = len(d)
    if n == 0:
        return {"n": 0, "mean": math.nan, "lo": math.nan, "hi": math.nan}
    m = sum(d) / n
    if n == 1:
        return {"n": 1, "mean": m, "lo": math.nan, "hi": math.nan, "diffs": d}
    sd = math.sqrt(sum((x - m) ** 2 for x in d) / (n - 1))
    half = t_quantile(0.975, n - 1) * sd / math.sqrt(n)
    return {"n": n, "mean": m, "lo": m - half, "hi": m + half, "sd": sd, "diffs": d}

"""The T3AR family (:mod:`t3ar.method.contrastive`): memory bank, filtered pseudo-labels, InfoNCE with retrieved
pool negatives. ``t3ar`` retrieves each target image's nearest pool neighbours, ``t3ar-random`` draws them at
random (the control), ``t3ar-noretrieval`` reads no pool.

The family's options come in groups (:class:`~t3ar.method.registry.OptionGroup`), each checking its own
interactions: the config calls the checks when it validates a family config, refuses a group's own options set in
any other method's config, and job sizing adds the second stage's steps and the Fisher anchor's pass to the job's
budget. The safeguards (reliable samples, anchor, collapse fallback, interpolation: :mod:`t3ar.method.safeguards`)
are SAR's, EATA's and WiSE-FT's mechanisms, each off by default.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from t3ar.method.registry import MethodSpec, OptionGroup, register

if TYPE_CHECKING:
    from t3ar.method.config import AdaptConfig

STEP = "t3ar.method.contrastive:T3AR"


def _teacher(config: AdaptConfig) -> None:
    if config.joint_pass and config.teacher_ema:
        raise ValueError("joint_pass and teacher_ema cannot be combined: the keys come from the EMA teacher, a "
                         "forward of its own (leave joint_pass unset: it is then off)")


def _refinement(config: AdaptConfig) -> None:
    if config.knn_refine_labelled and not config.knn_refine:
        raise ValueError("knn_refine_labelled lets labelled pool entries vote in the soft k-NN refinement: it "
                         "needs knn_refine")


def _second_stage(config: AdaptConfig) -> int:
    """The second stage's steps (bottleneck and head on the target alone), run after the first stage's."""
    return config.second_stage_steps


def _test_time_only(option: str, what: str) -> None:
    raise ValueError(f"{option} {what}: a test-time option (mode 'test'); with the target's labels (mode 'train') "
                     "there is nothing to filter or to watch")


def _reliable(config: AdaptConfig) -> None:
    if config.reliable_reweight and config.reliable_entropy is None:
        raise ValueError("reliable_reweight weights the reliable samples: it needs reliable_entropy (SAR and EATA: "
                         "0.4)")
    if config.reliable_entropy is not None and config.mode == "train":
        _test_time_only("reliable_entropy", "filters the pseudo-labelled samples by their prediction's entropy")


def _anchor(config: AdaptConfig) -> None:
    if config.anchor_weight is not None and config.anchor is None:
        raise ValueError("anchor_weight is the anchor's weight: it needs anchor ('l2' or 'fisher')")


def _fisher_pass(config: AdaptConfig) -> int:
    """The Fisher anchor's estimate: one pass over the target with gradient before the first step."""
    return 1 if config.anchor == "fisher" else 0


def _collapse(config: AdaptConfig) -> None:
    if config.collapse_fallback is not None and config.mode == "train":
        _test_time_only("collapse_fallback", "watches the pseudo-labels' class histogram")


GROUPS = (
    OptionGroup("retrieval", ("k", "r", "redraw_neighbours", "pool_negatives", "dedup_threshold", "false_negatives")),
    OptionGroup("pool data", ("pool_data_weight", "pool_data_threshold", "pool_data_norm", "pool_data_cap",
                              "pool_data_sources")),
    OptionGroup("pool labels", ("pool_label_weight", "pool_label_cap", "pool_label_balance")),
    OptionGroup("BatchNorm", ("bn_start", "bn_fixed"), own=("bn_start", "bn_fixed")),
    OptionGroup("teacher", ("teacher_ema",), own=("teacher_ema",), check=_teacher),
    OptionGroup("refinement", ("knn_refine", "knn_refine_labelled", "refine_neighbors"),
                own=("knn_refine", "knn_refine_labelled"), check=_refinement),
    OptionGroup("second stage", ("second_stage_steps", "second_stage_lr"), own=("second_stage_steps",),
                added_steps=_second_stage),
    OptionGroup("reliable samples", ("reliable_entropy", "reliable_reweight"),
                own=("reliable_entropy", "reliable_reweight"), check=_reliable),
    OptionGroup("anchor", ("anchor", "anchor_weight"), own=("anchor", "anchor_weight"), check=_anchor,
                added_passes=_fisher_pass),
    OptionGroup("collapse fallback", ("collapse_fallback",), own=("collapse_fallback",), check=_collapse),
    OptionGroup("interpolation", ("wise_alpha",), own=("wise_alpha",)),
)

register(MethodSpec("t3ar-noretrieval", "the T3AR family without a pool", step=STEP, family=True, bank=True,
                    groups=GROUPS))
register(MethodSpec("t3ar-random", "the T3AR family, random pool neighbours (the control)", step=STEP,
                    retrieval="random", family=True, bank=True, groups=GROUPS))
register(MethodSpec("t3ar", "T3AR: retrieved pool neighbours as InfoNCE negatives", step=STEP, retrieval="nearest",
                    family=True, bank=True, groups=GROUPS))

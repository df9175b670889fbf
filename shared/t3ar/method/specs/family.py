"""The T3AR family (:mod:`t3ar.method.contrastive`): memory bank, filtered pseudo-labels, InfoNCE with retrieved
pool negatives. ``t3ar`` retrieves each target image's nearest pool neighbours, ``t3ar-random`` draws them at
random (the control), ``t3ar-noretrieval`` reads no pool. The family's second stage
(``second_stage_steps``) adds its steps to the job's budget."""

from __future__ import annotations

from typing import TYPE_CHECKING

from t3ar.method.registry import MethodSpec, register

if TYPE_CHECKING:
    from t3ar.method.config import AdaptConfig

STEP = "t3ar.method.contrastive:T3AR"


def second_stage(config: AdaptConfig) -> int:
    """The second stage's steps (bottleneck and head on the target alone), run after the first stage's."""
    return config.second_stage_steps


register(MethodSpec("t3ar-noretrieval", "the T3AR family without a pool", step=STEP, family=True, bank=True,
                    added_steps=second_stage))
register(MethodSpec("t3ar-random", "the T3AR family, random pool neighbours (the control)", step=STEP,
                    retrieval="random", family=True, bank=True, added_steps=second_stage))
register(MethodSpec("t3ar", "T3AR: retrieved pool neighbours as InfoNCE negatives", step=STEP, retrieval="nearest",
                    family=True, bank=True, added_steps=second_stage))

"""``sar`` (:mod:`t3ar.method.sar`): entropy minimisation of the norm layers' affine parameters over reliable
samples, with a sharpness-aware step and a reset of the trainable weights when the loss collapses. Test time only."""

from typing import Literal

from t3ar.method.config import OptimiserConfig
from t3ar.method.registry import MethodSpec, register


class SARConfig(OptimiserConfig):
    """sar's options: the schedule and the loop's switches; no ``train_groups`` (it trains the norm layers'
    affine parameters alone)."""

    method: Literal["sar"] = "sar"


register(MethodSpec("sar", "SAR: reliable entropy minimisation, sharpness-aware step, reset on collapse",
                    config=SARConfig, step="t3ar.method.sar:SAR", train_mode=False))

"""``tent`` (:mod:`t3ar.method.tent`): entropy minimisation, BatchNorm affine parameters only."""

from typing import Literal

from t3ar.method.config import OptimiserConfig
from t3ar.method.registry import MethodSpec, register


class TentConfig(OptimiserConfig):
    """tent's options: the schedule and the loop's switches; no ``train_groups`` (it trains the norm layers'
    affine parameters alone)."""

    method: Literal["tent"] = "tent"


register(MethodSpec("tent", "entropy minimisation of BatchNorm's affine parameters", step="t3ar.method.tent:Tent",
                    config=TentConfig))

"""``eata`` (:mod:`t3ar.method.eata`): entropy minimisation of BatchNorm's affine parameters over reliable,
non-redundant samples, anchored to the start weights by a Fisher penalty. Test time only."""

from typing import Literal

from t3ar.method.config import OptimiserConfig
from t3ar.method.registry import MethodSpec, register


class EATAConfig(OptimiserConfig):
    """eata's options: the schedule and the loop's switches; no ``train_groups`` (it trains the norm layers'
    affine parameters alone)."""

    method: Literal["eata"] = "eata"


register(MethodSpec("eata", "EATA: reliable, non-redundant entropy minimisation with a Fisher anchor",
                    config=EATAConfig, step="t3ar.method.eata:EATA", train_mode=False))

"""``adacontrast`` (:mod:`t3ar.method.adacontrast`): momentum key encoder, queue, soft k-NN refined
pseudo-labels and a diversity term (weight 1 unless the config gives one). Test time only."""

from typing import Literal

from pydantic import Field

from t3ar.method.config import ContrastiveConfig
from t3ar.method.registry import MethodSpec, register


class AdaContrastConfig(ContrastiveConfig):
    """AdaContrast's options (its published defaults) over the bank and loss fields it shares with the T3AR
    family."""

    method: Literal["adacontrast"] = "adacontrast"
    ema: float = Field(default=0.999, ge=0, lt=1, description="key-encoder momentum")
    refine_neighbors: int = Field(default=10, ge=1, le=1024, description="soft-voting neighbours")


register(MethodSpec("adacontrast", "AdaContrast: momentum encoder, soft k-NN refined pseudo-labels",
                    step="t3ar.method.adacontrast:AdaContrast", train_mode=False, diversity_weight=1.0,
                    config=AdaContrastConfig))

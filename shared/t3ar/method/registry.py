"""The method registry: every name of :data:`t3ar.method.config.METHODS` and what adapts with it, declared once.

``source`` maps to None: the model is used as it is (no step); so does ``bn-adapt``, which has no optimiser
and no step either (:mod:`t3ar.method.bn_adapt`: :func:`t3ar.method.adapt.adapt` runs it). The names
themselves (and their static properties: retrieval, train mode) are declared in :mod:`t3ar.method.config`,
which stays free of torch for the services that only validate a config.
"""

from __future__ import annotations

from t3ar.method.adacontrast import AdaContrast
from t3ar.method.base import MethodStep
from t3ar.method.config import Method
from t3ar.method.contrastive import T3AR
from t3ar.method.eata import EATA
from t3ar.method.sar import SAR
from t3ar.method.shot import ShotIM
from t3ar.method.tent import Tent

METHOD_STEPS: dict[Method, type[MethodStep] | None] = {
    "source": None,
    "bn-adapt": None,
    "tent": Tent,
    "shot-im": ShotIM,
    "adacontrast": AdaContrast,
    "t3ar-noretrieval": T3AR,
    "t3ar-random": T3AR,
    "t3ar": T3AR,
    "sar": SAR,
    "eata": EATA,
}

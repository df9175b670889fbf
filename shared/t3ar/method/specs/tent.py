"""``tent`` (:mod:`t3ar.method.tent`): entropy minimisation, BatchNorm affine parameters only."""

from t3ar.method.registry import MethodSpec, register

register(MethodSpec("tent", "entropy minimisation of BatchNorm's affine parameters", step="t3ar.method.tent:Tent"))

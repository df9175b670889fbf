"""``eata`` (:mod:`t3ar.method.eata`): entropy minimisation of BatchNorm's affine parameters over reliable,
non-redundant samples, anchored to the start weights by a Fisher penalty. Test time only."""

from t3ar.method.registry import MethodSpec, register

register(MethodSpec("eata", "EATA: reliable, non-redundant entropy minimisation with a Fisher anchor",
                    step="t3ar.method.eata:EATA", train_mode=False))

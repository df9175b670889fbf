"""``source``: the model as it is (no adaptation; the baseline every method is compared with)."""

from t3ar.method.registry import MethodSpec, register

register(MethodSpec("source", "the model as it is, no adaptation"))

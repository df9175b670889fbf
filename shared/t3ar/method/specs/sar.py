"""``sar`` (:mod:`t3ar.method.sar`): entropy minimisation of the norm layers' affine parameters over reliable
samples, with a sharpness-aware step and a reset of the trainable weights when the loss collapses. Test time only."""

from t3ar.method.registry import MethodSpec, register

register(MethodSpec("sar", "SAR: reliable entropy minimisation, sharpness-aware step, reset on collapse",
                    step="t3ar.method.sar:SAR", train_mode=False))

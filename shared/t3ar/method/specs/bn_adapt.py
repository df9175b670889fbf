"""``bn-adapt`` (AdaBN): the target's BatchNorm statistics in one no-gradient pass, no optimiser
(:mod:`t3ar.method.bn_adapt`). Test time only."""

from t3ar.method.registry import MethodSpec, register

register(MethodSpec("bn-adapt", "the target's BatchNorm statistics, one pass without gradient", bn_statistics=True,
                    train_mode=False))

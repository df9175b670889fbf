"""``adacontrast`` (:mod:`t3ar.method.adacontrast`): momentum key encoder, queue, soft k-NN refined
pseudo-labels and a diversity term (weight 1 unless the config gives one). Test time only."""

from t3ar.method.registry import MethodSpec, register

register(MethodSpec("adacontrast", "AdaContrast: momentum encoder, soft k-NN refined pseudo-labels",
                    step="t3ar.method.adacontrast:AdaContrast", train_mode=False, bank=True, diversity_weight=1.0))

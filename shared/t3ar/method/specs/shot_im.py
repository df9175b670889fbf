"""``shot-im`` (:mod:`t3ar.method.shot`): information maximisation with the classifier head frozen."""

from t3ar.method.registry import MethodSpec, register

register(MethodSpec("shot-im", "information maximisation, classifier head frozen", step="t3ar.method.shot:ShotIM"))

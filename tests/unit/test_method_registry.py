"""The method registry names exactly the methods the config accepts, each behind the one interface."""

import pytest

from t3ar.method.base import MethodStep
from t3ar.method.config import METHODS, AdaptConfig, Method
from t3ar.method.registry import METHOD_STEPS


def test_registry_and_config_name_the_same_methods() -> None:
    assert list(METHOD_STEPS) == list(METHODS)


@pytest.mark.parametrize("method", METHODS)
def test_every_adapting_method_implements_the_interface(method: Method) -> None:
    impl = METHOD_STEPS[method]
    if method in ("source", "bn-adapt"):  # no step: the model as it is / its BatchNorm statistics
        assert impl is None
    else:
        assert impl is not None and issubclass(impl, MethodStep)
        AdaptConfig(method=method)  # a valid config for it exists

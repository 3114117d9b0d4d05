"""Registry of quantization methods: name -> QuantizationConfig factory.

`get_linear_method(quant_config, prefix)` is what a linear layer calls: the config's method
for that layer, or `UnquantizedLinearMethod` when the model is not quantized (config None).
A factory takes the checkpoint's `quantization_config` dict (None for online quantization
of an unquantized checkpoint) and returns the config.
"""

from __future__ import annotations

from collections.abc import Callable

from mini_sglang.layers.quantization.base import LinearMethodBase, QuantizationConfig
from mini_sglang.layers.quantization.unquantized import UnquantizedLinearMethod

QUANTIZATION_METHODS: dict[str, Callable[[dict | None], QuantizationConfig]] = {}

_UNQUANTIZED = UnquantizedLinearMethod()


def register_quantization(
    name: str,
) -> Callable[[Callable[[dict | None], QuantizationConfig]], Callable]:
    """Decorator: make `name` (SGLang's --quantization / quant_method name) build configs
    with the decorated factory."""

    def wrap(factory: Callable[[dict | None], QuantizationConfig]) -> Callable:
        QUANTIZATION_METHODS[name] = factory
        return factory

    return wrap


def get_linear_method(quant_config: QuantizationConfig | None, prefix: str) -> LinearMethodBase:
    """The method for the linear layer named `prefix` under `quant_config`."""
    if quant_config is None:
        return _UNQUANTIZED
    return quant_config.get_linear_method(prefix)

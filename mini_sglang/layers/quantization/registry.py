"""Registry of quantization methods: name -> QuantizationConfig factory.

`get_quant_config(spec)` builds a model's config from its QuantSpec (methods.py; None for
an unquantized model). `get_linear_method(quant_config, prefix)` is what a linear layer
calls: the config's method for that layer, or `UnquantizedLinearMethod` when the model is
not quantized (config None).
"""

from __future__ import annotations

from collections.abc import Callable

from mini_sglang.layers.quantization.base import LinearMethodBase, QuantizationConfig
from mini_sglang.layers.quantization.fp8 import Fp8Config
from mini_sglang.layers.quantization.methods import QuantSpec
from mini_sglang.layers.quantization.unquantized import UnquantizedLinearMethod

# Every name in methods.SUPPORTED_METHODS, and only those.
QUANTIZATION_METHODS: dict[str, Callable[[QuantSpec], QuantizationConfig]] = {
    "fp8": Fp8Config,
    "compressed-tensors": Fp8Config,
}

_UNQUANTIZED = UnquantizedLinearMethod()


def get_quant_config(spec: QuantSpec | None) -> QuantizationConfig | None:
    """The QuantizationConfig for a model whose quantization is `spec` (None: none)."""
    return None if spec is None else QUANTIZATION_METHODS[spec.method](spec)


def get_linear_method(quant_config: QuantizationConfig | None, prefix: str) -> LinearMethodBase:
    """The method for the linear layer named `prefix` under `quant_config`."""
    if quant_config is None:
        return _UNQUANTIZED
    return quant_config.get_linear_method(prefix)

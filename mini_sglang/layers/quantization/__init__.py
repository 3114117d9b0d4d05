"""Quantization methods for the linear layers (SGLang's srt/layers/quantization).

A `QuantizationConfig` (base.py) is built once per model from `--quantization` and the
checkpoint's `quantization_config` (methods.py decides which, registry.py builds it) and
hands each linear layer its `LinearMethodBase`, which creates that layer's parameters,
tells the layer's weight loader how to store a checkpoint tensor, and computes the layer's
output. `UnquantizedLinearMethod`
(unquantized.py) is the method of every layer of an unquantized model.
"""

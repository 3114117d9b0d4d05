"""Registering a layer's loadable parameters, for the linear and the MoE weight seams.

`make_param` is how a method's `create_weights` (layers/quantization/base.py for linear
layers, layers/moe/method.py for MoE layers) adds a parameter: the layer's `weight_loader`
loads it, and the attributes it carries (`input_dim`, `block_size`, `quantize_into`,
`quantize`) tell that loader how the parameter follows the weight's rows and columns and
whether checkpoint tensors are quantized on the way in; each seam's module doc says what
they mean there.
"""

from __future__ import annotations

import torch
from torch import nn


def make_param(layer: nn.Module, name: str, data: torch.Tensor, **attrs: object) -> nn.Parameter:
    """Register `data` as parameter `name` of `layer`, loaded by the layer's weight_loader
    and carrying the attributes `attrs`. A `quantize_into` scale parameter is marked
    `filled_by_weight` (its values come from quantizing the weight, so dummy weights and
    checkpoints without it leave it to the weight)."""
    param = nn.Parameter(data, requires_grad=False)
    param.weight_loader = layer.weight_loader
    if "quantize_into" in attrs:
        attrs["quantize_into"].filled_by_weight = True
    for key, value in attrs.items():
        setattr(param, key, value)
    layer.register_parameter(name, param)
    return param

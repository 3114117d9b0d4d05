"""The seam between FusedMoE and the way its experts' weights are stored and applied.

A `FusedMoEMethodBase` is to the MoE layer what `LinearMethodBase` (layers/quantization/
base.py) is to a linear layer. One object may serve many layers; per-layer state lives on
the layer as parameters. Contract:

- `create_weights(layer, num_experts, hidden_size, intermediate_size_per_partition,
  params_dtype)` registers `w13_weight` [E, 2I, H] ([gate; up] rows of each expert) and
  `w2_weight` [E, H, I] (E, I: this rank's experts and intermediate shard), plus whatever
  the method needs (scales). Every parameter gets the layer's `weight_loader`; dimension 0
  is the expert, dimension 1 follows the weight's output rows, and the attributes of the
  linear seam say the rest: `block_size` (rows, cols) of a scale element, and on a weight
  that stores low-precision values `quantize_into` (its scale parameter) and
  `quantize(t) -> (values, scales)` for one expert's [rows, cols] slice, so a tensor of
  another dtype is quantized while it loads (online quantization, and weight updates from
  unquantized tensors). Such a scale parameter is marked `filled_by_weight`. Because
  quantization happens in the loader, no pass over the weights after loading is needed.
- `apply(layer, x, topk_weights, topk_ids, dropped_pairs)` returns, for every token, the
  routing-weighted sum of its experts' outputs (experts_torch.py states it exactly), in
  x's dtype. topk_ids are local expert ids; negative ids (`dropped_pairs`) add nothing.
- `dequantized_weights(layer)` returns (w13, w2) as the float values the layer multiplies
  by (the reference of the tests and of weight read-back).

`UnquantizedFusedMoEMethod` is the method of every unquantized model: weights in the
model's dtype, the fused Triton kernels on CUDA, torch elsewhere. Quantized methods come
from the model's QuantizationConfig (`get_moe_method`).
"""

from __future__ import annotations

import torch
from torch import nn

from mini_sglang.layers.kernels import triton
from mini_sglang.layers.moe.experts_torch import fused_experts_torch
from mini_sglang.layers.moe.fused_moe_triton import fused_experts_triton
from mini_sglang.layers.parameter import make_param


class FusedMoEMethodBase:
    """How one kind of MoE layer stores and applies its experts (see the module doc)."""

    def create_weights(
        self,
        layer: nn.Module,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
    ) -> None:
        raise NotImplementedError

    def apply(
        self,
        layer: nn.Module,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        dropped_pairs: bool,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The routing-weighted sum of each token's experts, [tokens, H] in x's dtype; with
        `residual` ([tokens, H], x's dtype) it is added into residual in place (fused into
        the last kernel where the kernels can) and residual is returned."""
        raise NotImplementedError

    def dequantized_weights(self, layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        return layer.w13_weight.data, layer.w2_weight.data


class UnquantizedFusedMoEMethod(FusedMoEMethodBase):
    """w13 / w2 in params_dtype; fused_experts_triton on CUDA, fused_experts_torch else."""

    def create_weights(
        self,
        layer: nn.Module,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
    ) -> None:
        i = intermediate_size_per_partition
        make_param(
            layer, "w13_weight", torch.empty(num_experts, 2 * i, hidden_size, dtype=params_dtype)
        )
        make_param(layer, "w2_weight", torch.empty(num_experts, hidden_size, i, dtype=params_dtype))

    def apply(
        self,
        layer: nn.Module,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        dropped_pairs: bool,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if x.is_cuda and triton is not None:
            return fused_experts_triton(
                x,
                layer.w13_weight,
                layer.w2_weight,
                topk_weights,
                topk_ids,
                dropped_pairs=dropped_pairs,
                residual=residual,
            )
        out = fused_experts_torch(x, layer.w13_weight, layer.w2_weight, topk_weights, topk_ids)
        return out if residual is None else residual.add_(out)

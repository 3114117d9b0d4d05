"""The method of unquantized linear layers: a weight in the model's dtype, applied through
small_m_gemm (the Triton GEMV and its fused variants at small batches, else F.linear)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from mini_sglang.layers.parameter import make_param
from mini_sglang.layers.quantization.base import LinearMethodBase
from mini_sglang.layers.small_m_gemm import (
    linear,
    linear_add_,
    linear_rmsnorm,
    linear_silu_mul,
    rmsnorm_silu_mul_fold,
)

if TYPE_CHECKING:
    from mini_sglang.layers.layernorm import RMSNorm


class UnquantizedLinearMethod(LinearMethodBase):
    """weight [N, K] in params_dtype; every fused small-batch variant small_m_gemm has."""

    def create_weights(
        self,
        layer: nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
    ) -> None:
        shape = (sum(output_partition_sizes), input_size_per_partition)
        make_param(layer, "weight", torch.empty(shape, dtype=params_dtype))

    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return linear(x, layer.weight, bias)

    def apply_rmsnorm(
        self, layer: nn.Module, x: torch.Tensor, norm: RMSNorm
    ) -> torch.Tensor | None:
        return linear_rmsnorm(x, layer.weight, norm.weight.data, norm.variance_epsilon)

    def apply_silu_mul(
        self, layer: nn.Module, x: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor | None:
        return linear_silu_mul(x, layer.weight)

    def rmsnorm_silu_mul_fold(
        self, layer: nn.Module, x: torch.Tensor, norm: RMSNorm
    ) -> Callable[[torch.Tensor], torch.Tensor] | None:
        return rmsnorm_silu_mul_fold(x, layer.weight, norm.weight.data, norm.variance_epsilon)

    def apply_add_(self, layer: nn.Module, x: torch.Tensor, residual: torch.Tensor) -> bool:
        return linear_add_(x, layer.weight, residual)

"""The quantization seam: `QuantizationConfig` picks a `LinearMethodBase` per linear layer
(and a `FusedMoEMethodBase`, layers/moe/method.py, per MoE layer: `get_moe_method`).

Contract of a linear method (one object may serve many layers; per-layer state lives on the
layer as parameters):
- `create_weights(layer, input_size_per_partition, output_partition_sizes, input_size,
  output_size, params_dtype)` registers the layer's parameters (`weight` [N, K] always,
  plus whatever the method needs, e.g. scales). Every parameter gets the layer's
  `weight_loader` and may carry these attributes, read by `load_column_shard` /
  `load_row_shard` so that TP sharding and the stacked q/k/v and gate/up loading work for
  every method without knowing it:
    - dimension 0 of every parameter follows the output features (weight rows);
      `input_dim`: its dimension that follows the input features (weight columns), or
      None where it has none; default 1 for 2-D parameters, None for 1-D ones (a bias, a
      per-channel scale).
    - `block_size` (rows, cols): one element of the parameter covers that many weight rows
      / columns (block-wise scales); default (1, 1).
    - `quantize_into` (a scale parameter) and `quantize(t) -> (values, scales)`: the
      parameter stores low-precision values, and a checkpoint tensor of another dtype
      loaded into it is quantized on the way in, its scales going to the matching rows
      (or row blocks) of the scale parameter (online quantization, and updates of a
      quantized model from unquantized tensors). Such a scale parameter is marked
      `filled_by_weight` (dummy weights skip it).
  A checkpoint tensor with one element loaded into a parameter with more elements is
  broadcast over the rows of its shard (a per-tensor scale stored per channel).
- `apply(layer, x, bias)` returns x @ W^T + bias as the layer's output dtype.
- The fused variants the decoder's small-batch path asks for return None (or False for
  `apply_add_`) where the method has no such fusion; the layer then runs the unfused steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from mini_sglang.layers.layernorm import RMSNorm
    from mini_sglang.layers.moe.method import FusedMoEMethodBase


class LinearMethodBase:
    """How one kind of linear layer stores and applies its weight (see the module doc)."""

    def create_weights(
        self,
        layer: nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
    ) -> None:
        raise NotImplementedError

    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        raise NotImplementedError

    def dequantized_weight(self, layer: nn.Module) -> torch.Tensor:
        """The weight's values [N, K] in a float dtype (what the layer multiplies by)."""
        return layer.weight.data

    def apply_rmsnorm(
        self, layer: nn.Module, x: torch.Tensor, norm: RMSNorm
    ) -> torch.Tensor | None:
        """apply(layer, norm(x)) in one kernel, or None (no such fusion here)."""
        return None

    def apply_silu_mul(
        self, layer: nn.Module, x: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor | None:
        """act(apply(layer, x)) for a [gate; up] weight in one kernel, or None."""
        return None

    def rmsnorm_silu_mul_fold(
        self, layer: nn.Module, x: torch.Tensor, norm: RMSNorm
    ) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """For inputs like x (its values unread): a function r -> silu(gate) * up of
        apply(layer, norm(r)) for a [gate; up] weight in one kernel, or None (no such
        fusion here). Asked before r is computed, so the caller can pick its dataflow."""
        return None

    def apply_add_rmsnorm(
        self, layer: nn.Module, x: torch.Tensor, residual: torch.Tensor, norm: RMSNorm
    ) -> torch.Tensor | None:
        """apply(layer, h) for h, residual = norm(x, residual), with the add-RMSNorm folded
        into the method's own input kernel (residual += x in place, as norm's kernel does
        it); None, touching nothing, where the method has no such kernel."""
        return None

    def apply_after_silu_mul(self, layer: nn.Module, gate_up: torch.Tensor) -> torch.Tensor | None:
        """apply(layer, silu(gate) * up) for gate_up = [gate | up], with the SiLU-mul folded
        into the method's own input kernel; None where the method has no such kernel."""
        return None

    def apply_add_(self, layer: nn.Module, x: torch.Tensor, residual: torch.Tensor) -> bool:
        """residual += apply(layer, x) in one kernel; False (residual untouched) if not."""
        return False


class QuantizationConfig:
    """One quantization scheme of a model; `get_linear_method` is asked once per linear layer.

    `prefix` is the layer's module name in the checkpoint (e.g.
    "model.layers.0.self_attn.qkv_proj"), so a config can leave layers unquantized
    (`ignored_layers`)."""

    name: str = ""

    def get_linear_method(self, prefix: str) -> LinearMethodBase:
        raise NotImplementedError

    def get_moe_method(self, prefix: str) -> FusedMoEMethodBase:
        """The method of the FusedMoE layer `prefix` (e.g. "model.layers.0.mlp.experts");
        a config without one refuses the model at build time rather than serving its
        experts unquantized."""
        raise ValueError(
            f"{self.name or type(self).__name__} quantization of MoE experts ({prefix}) is not "
            "supported; serve the model unquantized"
        )


def _store(param: nn.Parameter, row: int, loaded: torch.Tensor) -> None:
    """Copy loaded into param's rows [row, row + len(loaded)) (all of param where loaded has
    its shape), quantizing it first where param has `quantize_into`."""
    dst = param.data if loaded.shape == param.shape else param.data.narrow(0, row, len(loaded))
    scale_param = getattr(param, "quantize_into", None)
    if scale_param is None or loaded.dtype == param.dtype:
        dst.copy_(loaded)
        return
    # quantized where the parameter lives: a checkpoint tensor arrives on the host, and
    # quantizing a large model there would take far longer than the copy
    values, scales = param.quantize(loaded.to(dst.device))
    dst.copy_(values)
    unit = getattr(scale_param, "block_size", (1, 1))[0]
    if row % unit:
        raise ValueError(f"a shard at weight row {row} is not aligned to {unit}-row scale blocks")
    scale_rows = scale_param.data.narrow(0, row // unit, scales.shape[0])
    scale_rows.copy_(scales.reshape(scale_rows.shape))


def load_column_shard(
    param: nn.Parameter, loaded: torch.Tensor, offset: int, size: int, src_start: int
) -> None:
    """Copy weight rows [src_start, src_start + size) of the checkpoint tensor `loaded` into
    rows [offset, offset + size) of `param` (in weight-row units; `block_size` converts).
    Column-parallel parameters always have output_dim 0."""
    rows = getattr(param, "block_size", (1, 1))[0]
    if offset % rows or src_start % rows:
        raise ValueError(
            f"a shard at weight row {offset} (source row {src_start}) is not aligned to the "
            f"{rows}-row blocks of its scales"
        )
    n = -(-size // rows)
    if loaded.numel() == 1 and n * param[0].numel() > 1:  # a per-tensor scale, per channel
        param.data.narrow(0, offset // rows, n).fill_(loaded.reshape(()).item())
        return
    if loaded.dim() == 2 and param.dim() == 1:  # a per-channel scale saved as [N, 1]
        loaded = loaded.reshape(-1)
    _store(param, offset // rows, loaded.narrow(0, src_start // rows, n))


def load_row_shard(param: nn.Parameter, loaded: torch.Tensor, tp_rank: int) -> None:
    """Copy this rank's input-feature (column) slice of `loaded` into `param`; parameters
    without an input dimension (bias, per-channel scales) are copied whole."""
    default_in = 1 if param.dim() >= 2 else None
    in_dim = getattr(param, "input_dim", default_in)
    if in_dim is None:
        if loaded.numel() == 1 and param.numel() > 1:  # a per-tensor scale, per channel
            param.data.fill_(loaded.reshape(()).item())
        else:
            _store(param, 0, loaded.reshape(param.shape))
        return
    size = param.shape[in_dim]
    _store(param, 0, loaded.narrow(in_dim, tp_rank * size, size))

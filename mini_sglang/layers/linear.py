"""Tensor-parallel linear layers with per-parameter weight loaders and a quantization method.

Each layer asks its method (layers/quantization: `get_linear_method(quant_config, prefix)`;
unquantized unless the model's QuantizationConfig says otherwise) to create its parameters
and to compute its output; the sharding below is the layer's, the same for every method.
Each parameter carries `weight_loader(param, loaded_weight, shard_id=None)` that copies this
rank's slice of a full checkpoint tensor into it, so the model loader never needs to know how
a layer is sharded. Column-parallel layers split the output dimension, row-parallel layers the
input dimension (followed by an all-reduce).

Worked example (QKVParallelLinear, tp=2, 8 query heads, 2 KV heads, head_dim 64): each rank
holds 4 q heads and 1 kv head; its fused weight is [(4 + 1 + 1) * 64, hidden] laid out as
[q rows 0..255 | k rows 256..319 | v rows 320..383]; rank 1 copies q rows 256..511 and kv rows
64..127 of the checkpoint's q_proj / k_proj / v_proj.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from mini_sglang.distributed.parallel_state import (
    divide,
    get_tp_rank,
    get_tp_size,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from mini_sglang.layers.parameter import make_param
from mini_sglang.layers.quantization.base import (
    QuantizationConfig,
    load_column_shard,
    load_row_shard,
)
from mini_sglang.layers.quantization.registry import get_linear_method

if TYPE_CHECKING:
    from mini_sglang.layers.layernorm import RMSNorm


class ColumnParallelLinear(nn.Module):
    """Y = X A^T with A's rows (output features) split across ranks."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        gather_output: bool = False,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        self.input_size = input_size
        self.output_size_per_partition = divide(output_size, self.tp_size)
        self.gather_output = gather_output
        self.quant_method = get_linear_method(quant_config, prefix)
        self.quant_method.create_weights(
            self,
            input_size,
            [divide(size, self.tp_size) for size in self.logical_output_sizes(output_size)],
            input_size,
            output_size,
            torch.get_default_dtype(),
        )
        self.bias = (
            make_param(self, "bias", torch.empty(self.output_size_per_partition)) if bias else None
        )

    def logical_output_sizes(self, output_size: int) -> list[int]:
        """The full output sizes of the projections fused in this layer."""
        return [output_size]

    def shard_rows(self, shard_id) -> tuple[int, int, int]:
        """(offset, size, source start) in weight rows: the checkpoint tensor of `shard_id`
        fills rows [offset, offset + size) of this rank's weight from its rows
        [source start, source start + size)."""
        size = self.output_size_per_partition
        return 0, size, self.tp_rank * size

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        load_column_shard(param, loaded, *self.shard_rows(shard_id))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.quant_method.apply(self, x, self.bias)
        return tensor_model_parallel_all_gather(out) if self.gather_output else out

    def forward_rmsnorm(self, x: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
        """forward(norm(x)); at small batches the norm may happen inside the GEMV
        (the method's apply_rmsnorm, e.g. small_m_gemm.linear_rmsnorm)."""
        fused = None
        if self.bias is None and not self.gather_output:
            fused = self.quant_method.apply_rmsnorm(self, x, norm)
        return self.forward(norm(x)) if fused is None else fused

    def forward_fused_add_rmsnorm(
        self, x: torch.Tensor, residual: torch.Tensor, norm: RMSNorm
    ) -> torch.Tensor | None:
        """forward(h) for h, residual = norm(x, residual) (residual updated in place), where
        the method folds the add-RMSNorm into its input kernel (apply_add_rmsnorm, e.g. FP8's
        per-token quantization); None, touching nothing, where it does not: the caller then
        runs norm and its usual path (which may fuse other work, e.g. a SiLU-mul GEMV)."""
        if self.bias is not None or self.gather_output:
            return None
        return self.quant_method.apply_add_rmsnorm(self, x, residual, norm)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections fused into one matmul (e.g. gate_proj + up_proj).

    shard_id is the index of the projection in `output_sizes`.
    """

    def __init__(
        self,
        input_size: int,
        output_sizes: list[int],
        bias: bool = False,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        self.output_sizes = output_sizes
        super().__init__(
            input_size, sum(output_sizes), bias, quant_config=quant_config, prefix=prefix
        )

    def logical_output_sizes(self, output_size: int) -> list[int]:
        return list(self.output_sizes)

    def shard_rows(self, shard_id) -> tuple[int, int, int]:
        assert shard_id is not None, "merged weights are loaded one projection at a time"
        shard = self.output_sizes[shard_id] // self.tp_size
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        return offset, shard, self.tp_rank * shard

    def forward_silu_mul(
        self, x: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """act(forward(x)) for a [gate; up] projection and act = SiLU-and-multiply; at small
        batches the activation may happen in the GEMV's epilogue (the method's
        apply_silu_mul, e.g. small_m_gemm.linear_silu_mul)."""
        fused = self.quant_method.apply_silu_mul(self, x, act) if self._gate_up else None
        return act(self.forward(x)) if fused is None else fused

    @property
    def _gate_up(self) -> bool:
        """Whether this is a [gate; up] pair a GEMV epilogue can activate: two equal halves,
        no bias."""
        return (
            self.bias is None
            and len(self.output_sizes) == 2
            and self.output_sizes[0] == self.output_sizes[1]
        )

    def rmsnorm_silu_mul_fold(
        self, x: torch.Tensor, norm: RMSNorm
    ) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """For inputs like x: a function r -> act(forward(norm(r))) (act the SiLU-and-mul of
        forward_silu_mul) in one kernel where the method folds both (its
        rmsnorm_silu_mul_fold), else None; decided before r exists, so a decoder can choose
        to add into r elsewhere (e.g. in o_proj's epilogue) instead of in the norm kernel."""
        if not self._gate_up or self.gather_output:
            return None
        return self.quant_method.rmsnorm_silu_mul_fold(self, x, norm)


class QKVParallelLinear(ColumnParallelLinear):
    """Fused q/k/v projection; KV heads are replicated when there are fewer than ranks."""

    def __init__(
        self,
        hidden_size: int,
        head_size: int,
        total_num_heads: int,
        total_num_kv_heads: int,
        bias: bool = False,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        tp_size = get_tp_size()
        self.head_size = head_size
        self.total_num_heads = total_num_heads
        self.total_num_kv_heads = total_num_kv_heads
        self.num_heads = divide(total_num_heads, tp_size)
        if tp_size >= total_num_kv_heads:
            self.num_kv_heads = 1
            self.num_kv_replicas = divide(tp_size, total_num_kv_heads)
        else:
            self.num_kv_heads = divide(total_num_kv_heads, tp_size)
            self.num_kv_replicas = 1
        output_size = (self.num_heads + 2 * self.num_kv_heads) * tp_size * head_size
        super().__init__(hidden_size, output_size, bias, quant_config=quant_config, prefix=prefix)

    def logical_output_sizes(self, output_size: int) -> list[int]:
        tp_size = get_tp_size()
        kv = self.num_kv_heads * tp_size * self.head_size
        return [self.num_heads * tp_size * self.head_size, kv, kv]

    def shard_rows(self, shard_id) -> tuple[int, int, int]:
        q_size = self.num_heads * self.head_size
        kv_size = self.num_kv_heads * self.head_size
        if shard_id == "q":
            offset, size, rank = 0, q_size, self.tp_rank
        elif shard_id in ("k", "v"):
            offset = q_size if shard_id == "k" else q_size + kv_size
            size, rank = kv_size, self.tp_rank // self.num_kv_replicas
        else:
            raise ValueError(f"QKVParallelLinear shard_id must be q, k or v, got {shard_id!r}")
        return offset, size, rank * size


class RowParallelLinear(nn.Module):
    """Y = X A^T with A's columns (input features) split across ranks, then all-reduced."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        reduce_results: bool = True,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        self.input_size_per_partition = divide(input_size, self.tp_size)
        self.reduce_results = reduce_results
        self.quant_method = get_linear_method(quant_config, prefix)
        self.quant_method.create_weights(
            self,
            self.input_size_per_partition,
            [output_size],
            input_size,
            output_size,
            torch.get_default_dtype(),
        )
        self.bias = make_param(self, "bias", torch.empty(output_size)) if bias else None

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        load_row_shard(param, loaded, self.tp_rank)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._reduce(self.quant_method.apply(self, x))

    def _reduce(self, out: torch.Tensor) -> torch.Tensor:
        if self.reduce_results and self.tp_size > 1:
            out = tensor_model_parallel_all_reduce(out)
        # The bias is added once, after the reduction, so it is not counted tp_size times.
        return out + self.bias if self.bias is not None else out

    def forward_after_silu_mul(
        self, gate_up: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """forward(act(gate_up)) for gate_up = [gate | up] (a gate_up projection's output) and
        act its SiLU-and-mul; the method may fold act into its input kernel
        (apply_after_silu_mul, e.g. FP8's per-token quantization)."""
        out = self.quant_method.apply_after_silu_mul(self, gate_up)
        return self.forward(act(gate_up)) if out is None else self._reduce(out)

    def forward_add_(self, x: torch.Tensor, residual: torch.Tensor) -> None:
        """residual += forward(x), in place; on one rank at small batches the add may happen
        in the GEMV's epilogue (the method's apply_add_, e.g. small_m_gemm.linear_add_)."""
        if (
            self.tp_size == 1
            and self.bias is None
            and self.quant_method.apply_add_(self, x, residual)
        ):
            return
        residual.add_(self.forward(x))

"""Tensor-parallel linear layers with per-parameter weight loaders.

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
from mini_sglang.layers.small_m_gemm import linear, linear_add_, linear_rmsnorm, linear_silu_mul

if TYPE_CHECKING:
    from mini_sglang.layers.layernorm import RMSNorm


def _make_param(shape: tuple[int, ...], loader) -> nn.Parameter:
    param = nn.Parameter(torch.empty(shape), requires_grad=False)
    param.weight_loader = loader
    return param


class ColumnParallelLinear(nn.Module):
    """Y = X A^T with A's rows (output features) split across ranks."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        gather_output: bool = False,
    ) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        self.input_size = input_size
        self.output_size_per_partition = divide(output_size, self.tp_size)
        self.gather_output = gather_output
        self.weight = _make_param((self.output_size_per_partition, input_size), self.weight_loader)
        self.bias = (
            _make_param((self.output_size_per_partition,), self.weight_loader) if bias else None
        )

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        size = param.shape[0]
        param.data.copy_(loaded.narrow(0, self.tp_rank * size, size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = linear(x, self.weight, self.bias)
        return tensor_model_parallel_all_gather(out) if self.gather_output else out

    def forward_rmsnorm(self, x: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
        """forward(norm(x)); at small batches the norm happens inside the GEMV
        (small_m_gemm.linear_rmsnorm)."""
        fused = None
        if self.bias is None and not self.gather_output:
            fused = linear_rmsnorm(x, self.weight, norm.weight.data, norm.variance_epsilon)
        return self.forward(norm(x)) if fused is None else fused


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections fused into one matmul (e.g. gate_proj + up_proj).

    shard_id is the index of the projection in `output_sizes`.
    """

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False) -> None:
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        assert shard_id is not None, "merged weights are loaded one projection at a time"
        shard = self.output_sizes[shard_id] // self.tp_size
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        param.data.narrow(0, offset, shard).copy_(loaded.narrow(0, self.tp_rank * shard, shard))

    def forward_silu_mul(
        self, x: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """act(forward(x)) for a [gate; up] projection and act = SiLU-and-multiply; at small
        batches the activation happens in the GEMV's epilogue (small_m_gemm.linear_silu_mul)."""
        fused = None
        if (
            self.bias is None
            and len(self.output_sizes) == 2
            and self.output_sizes[0] == self.output_sizes[1]
        ):
            fused = linear_silu_mul(x, self.weight)
        return act(self.forward(x)) if fused is None else fused


class QKVParallelLinear(ColumnParallelLinear):
    """Fused q/k/v projection; KV heads are replicated when there are fewer than ranks."""

    def __init__(
        self,
        hidden_size: int,
        head_size: int,
        total_num_heads: int,
        total_num_kv_heads: int,
        bias: bool = False,
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
        super().__init__(hidden_size, output_size, bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        q_size = self.num_heads * self.head_size
        kv_size = self.num_kv_heads * self.head_size
        if shard_id == "q":
            offset, size, rank = 0, q_size, self.tp_rank
        elif shard_id in ("k", "v"):
            offset = q_size if shard_id == "k" else q_size + kv_size
            size, rank = kv_size, self.tp_rank // self.num_kv_replicas
        else:
            raise ValueError(f"QKVParallelLinear shard_id must be q, k or v, got {shard_id!r}")
        param.data.narrow(0, offset, size).copy_(loaded.narrow(0, rank * size, size))


class RowParallelLinear(nn.Module):
    """Y = X A^T with A's columns (input features) split across ranks, then all-reduced."""

    def __init__(
        self, input_size: int, output_size: int, bias: bool = False, reduce_results: bool = True
    ) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        self.input_size_per_partition = divide(input_size, self.tp_size)
        self.reduce_results = reduce_results
        self.weight = _make_param((output_size, self.input_size_per_partition), self.weight_loader)
        self.bias = _make_param((output_size,), self._bias_loader) if bias else None

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        size = param.shape[1]
        param.data.copy_(loaded.narrow(1, self.tp_rank * size, size))

    def _bias_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        param.data.copy_(loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = linear(x, self.weight)
        if self.reduce_results and self.tp_size > 1:
            out = tensor_model_parallel_all_reduce(out)
        # The bias is added once, after the reduction, so it is not counted tp_size times.
        return out + self.bias if self.bias is not None else out

    def forward_add_(self, x: torch.Tensor, residual: torch.Tensor) -> None:
        """residual += forward(x), in place; on one rank at small batches the add happens in
        the GEMV's epilogue (small_m_gemm.linear_add_)."""
        if self.tp_size == 1 and self.bias is None and linear_add_(x, self.weight, residual):
            return
        residual.add_(self.forward(x))

"""FusedMoE: every expert's gated MLP stacked into two parameters, split over the TP group.

Parameters (on each rank): w13_weight [E_local, 2 * I_shard, H] ([gate; up] rows of each
expert) and w2_weight [E_local, H, I_shard]. With --ep-size G the E experts form G groups of
E / G whole experts (rank r holds group r // (tp / G)); inside a group each expert's
intermediate dimension I is split over the tp / G ranks (I_shard = I * G / tp), SGLang's
default when G is 1. Every rank computes its experts' share for all tokens; the sum over
ranks (the TP all-reduce, done here with `reduce_results` or by the caller, who may add a
shared expert first) is the full output.

Checkpoints store each expert's gate / up / down projection separately; the model maps
their names onto these two parameters with `make_expert_params_mapping` and calls
`weight_loader(param, tensor, shard_id, expert_id)` (shard ids "w1" gate, "w3" up, "w2"
down, SGLang's names), which keeps only this rank's experts and slice.

Quantization: this layer is the unquantized method. Quantized experts (e.g. FP8) would take
a method object from the QuantizationConfig here (create weights / load / apply), as the
linear layers do (layers/quantization); until then a quant_config is refused at build time
rather than silently serving unquantized experts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from mini_sglang.distributed.parallel_state import (
    divide,
    get_moe_ep_rank,
    get_moe_ep_size,
    get_moe_tp_rank,
    get_moe_tp_size,
    get_tp_size,
    tensor_model_parallel_all_reduce,
)
from mini_sglang.layers.moe.experts_torch import fused_experts_torch
from mini_sglang.layers.moe.fused_moe_triton import fused_experts_triton
from mini_sglang.layers.moe.router import select_experts

if TYPE_CHECKING:
    from mini_sglang.layers.quantization.base import QuantizationConfig


def triton_available() -> bool:
    try:
        import triton  # noqa: F401  # deferred: optional on CPU-only installs
    except ImportError:
        return False
    return True


class FusedMoE(nn.Module):
    """The routed experts of one MoE block: forward(hidden [T, H], router_logits [T, E])
    -> [T, H] (this rank's partial sum unless reduce_results)."""

    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        intermediate_size: int,
        renormalize: bool,
        reduce_results: bool = True,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        if quant_config is not None:
            raise ValueError(
                f"{quant_config.name or type(quant_config).__name__} quantization of MoE "
                f"experts ({prefix}) is not supported; serve the model unquantized"
            )
        self.num_experts = num_experts
        self.top_k = top_k
        self.renormalize = renormalize
        self.reduce_results = reduce_results
        self.ep_size, self.ep_rank = get_moe_ep_size(), get_moe_ep_rank()
        self.moe_tp_size, self.moe_tp_rank = get_moe_tp_size(), get_moe_tp_rank()
        self.num_local_experts = divide(num_experts, self.ep_size)
        self.first_expert = self.ep_rank * self.num_local_experts
        self.intermediate_size = intermediate_size
        self.intermediate_per_partition = divide(intermediate_size, self.moe_tp_size)
        i_shard = self.intermediate_per_partition
        self.w13_weight = nn.Parameter(
            torch.empty(self.num_local_experts, 2 * i_shard, hidden_size), requires_grad=False
        )
        self.w2_weight = nn.Parameter(
            torch.empty(self.num_local_experts, hidden_size, i_shard), requires_grad=False
        )
        self.w13_weight.weight_loader = self.weight_loader
        self.w2_weight.weight_loader = self.weight_loader
        self.use_triton = None  # decided on the first forward (the device is known then)

    @staticmethod
    def make_expert_params_mapping(
        ckpt_gate_proj_name: str, ckpt_down_proj_name: str, ckpt_up_proj_name: str, num_experts: int
    ) -> list[tuple[str, str, int, str]]:
        """(parameter name fragment, checkpoint name fragment, expert id, shard id) for every
        expert's three projections: "experts.3.gate_proj." -> ("experts.w13_", ..., 3, "w1")."""
        return [
            (
                "experts.w13_"
                if name in (ckpt_gate_proj_name, ckpt_up_proj_name)
                else "experts.w2_",
                f"experts.{expert}.{name}.",
                expert,
                shard,
            )
            for expert in range(num_experts)
            for shard, name in (
                ("w1", ckpt_gate_proj_name),
                ("w2", ckpt_down_proj_name),
                ("w3", ckpt_up_proj_name),
            )
        ]

    def weight_loader(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str, expert_id: int
    ) -> None:
        """Copy this rank's slice of one expert's checkpoint projection (gate / up [I, H],
        down [H, I]) into the stacked parameter; other ranks' experts are skipped."""
        local = expert_id - self.first_expert
        if not 0 <= local < self.num_local_experts:
            return
        size = self.intermediate_per_partition
        start = self.moe_tp_rank * size
        if shard_id in ("w1", "w3"):
            offset = 0 if shard_id == "w1" else size
            param.data[local].narrow(0, offset, size).copy_(loaded.narrow(0, start, size))
        elif shard_id == "w2":
            param.data[local].copy_(loaded.narrow(1, start, size))
        else:
            raise ValueError(f"FusedMoE shard_id must be w1, w2 or w3, got {shard_id!r}")

    def load_full(self, param: nn.Parameter, full: torch.Tensor) -> None:
        """Keep this rank's slice of the whole stacked tensor (w13 [E, 2I, H] or w2 [E, H, I]),
        as one rank holding every expert unsplit would have it (the dummy loader at tp > 1)."""
        experts = full.narrow(0, self.first_expert, self.num_local_experts)
        for expert in range(self.num_local_experts):
            expert_id = self.first_expert + expert
            if param is self.w2_weight:
                self.weight_loader(param, experts[expert], "w2", expert_id)
                continue
            gate, up = experts[expert].chunk(2, dim=0)
            self.weight_loader(param, gate, "w1", expert_id)
            self.weight_loader(param, up, "w3", expert_id)

    def _local_ids(self, topk_ids: torch.Tensor) -> torch.Tensor:
        if self.ep_size == 1:
            return topk_ids
        local = topk_ids - self.first_expert
        return torch.where((local >= 0) & (local < self.num_local_experts), local, -1)

    def forward(self, hidden: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        topk_weights, topk_ids = select_experts(router_logits, self.top_k, self.renormalize)
        topk_ids = self._local_ids(topk_ids)
        if self.use_triton is None:
            self.use_triton = hidden.is_cuda and triton_available()
        if self.use_triton:
            out = fused_experts_triton(
                hidden,
                self.w13_weight,
                self.w2_weight,
                topk_weights,
                topk_ids,
                dropped_pairs=self.ep_size > 1,
            )
        else:
            out = fused_experts_torch(
                hidden, self.w13_weight, self.w2_weight, topk_weights, topk_ids
            )
        if self.reduce_results and get_tp_size() > 1:
            out = tensor_model_parallel_all_reduce(out)
        return out

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

Quantization: the layer's `quant_method` (layers/moe/method.py) creates its parameters and
computes the experts; it is `UnquantizedFusedMoEMethod` for an unquantized model, else what
the model's QuantizationConfig returns from `get_moe_method(prefix)` (FP8: layers/
quantization/fp8_moe.py). The loader below is the same for every method: parameter
attributes (`block_size`, `quantize_into`) tell it how a scale maps onto weight rows and
columns and which weights quantize what they load.
"""

from __future__ import annotations

from collections.abc import Callable
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
from mini_sglang.layers.moe.method import FusedMoEMethodBase, UnquantizedFusedMoEMethod
from mini_sglang.layers.moe.router import select_experts

if TYPE_CHECKING:
    from mini_sglang.layers.quantization.base import QuantizationConfig

_UNQUANTIZED = UnquantizedFusedMoEMethod()


def _check_aligned(what: str, position: int, unit: int) -> None:
    if position % unit:
        raise ValueError(f"{what} at {position} is not aligned to the {unit}-wide scale blocks")


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
        self.quant_method: FusedMoEMethodBase = (
            _UNQUANTIZED if quant_config is None else quant_config.get_moe_method(prefix)
        )
        self.quant_method.create_weights(
            self,
            self.num_local_experts,
            hidden_size,
            self.intermediate_per_partition,
            torch.get_default_dtype(),
        )
        # Set by ExpertDistributionRecorder.attach (--expert-distribution-recorder-mode):
        # called with each forward's global top-k ids.
        self.record_experts: Callable[[torch.Tensor], None] | None = None

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
        """Copy this rank's slice of one expert's checkpoint tensor into the stacked
        parameter; other ranks' experts are skipped. Weights: gate / up [I, H], down [H, I];
        their scales (when the method has them): per channel ([I] or [I, 1], [H]), per
        tensor (one element, stored on each row of the projection) or per block
        ([I / bn, H / bk], [H / bn, I / bk]), as `param.block_size` says. A tensor of another
        dtype than a weight that has `quantize_into` is quantized on the way in."""
        local = expert_id - self.first_expert
        if not 0 <= local < self.num_local_experts:
            return
        size = self.intermediate_per_partition
        start = self.moe_tp_rank * size
        rows, cols = getattr(param, "block_size", (1, 1))
        if shard_id in ("w1", "w3"):  # output rows [start, start + size) of the projection
            offset = 0 if shard_id == "w1" else size
            _check_aligned(f"the {shard_id} shard's row", offset, rows)
            _check_aligned(f"the {shard_id} shard's checkpoint row", start, rows)
            n = -(-size // rows)
            if loaded.numel() == 1 and n * param[local, 0].numel() > 1:  # a per-tensor scale
                param.data[local].narrow(0, offset // rows, n).fill_(loaded.item())
                return
            if loaded.dim() == 2 and param.dim() == 2:  # a per-channel scale saved [I, 1]
                loaded = loaded.reshape(-1)
            self._store(param, local, offset // rows, loaded.narrow(0, start // rows, n))
        elif shard_id == "w2":  # input columns [start, start + size): all output rows
            if param.dim() == 2:  # a per-channel or per-tensor scale [H]: no input dimension
                param.data[local].copy_(loaded.reshape(-1).expand(param.shape[1]))
                return
            _check_aligned("the w2 shard's checkpoint column", start, cols)
            self._store(param, local, 0, loaded.narrow(1, start // cols, param.shape[2]))
        else:
            raise ValueError(f"FusedMoE shard_id must be w1, w2 or w3, got {shard_id!r}")

    @staticmethod
    def _store(param: nn.Parameter, local: int, row: int, loaded: torch.Tensor) -> None:
        """Copy `loaded` into rows [row, row + len(loaded)) of expert `local`'s slice of
        param, quantizing it first (scales into the matching rows of `quantize_into`) where
        param stores another dtype."""
        dst = param.data[local].narrow(0, row, loaded.shape[0])
        scale_param = getattr(param, "quantize_into", None)
        if scale_param is None or loaded.dtype == param.dtype:
            dst.copy_(loaded)
            return
        # quantized where the parameter lives (a checkpoint tensor arrives on the host)
        values, scales = param.quantize(loaded.to(dst.device))
        dst.copy_(values)
        unit = getattr(scale_param, "block_size", (1, 1))[0]
        scale_rows = scale_param.data[local].narrow(0, row // unit, scales.shape[0])
        scale_rows.copy_(scales.reshape(scale_rows.shape))

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

    def forward(
        self,
        hidden: torch.Tensor,
        router_logits: torch.Tensor,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The experts' output for hidden [tokens, H] routed by router_logits [tokens, E]
        (all-reduced where reduce_results at tp > 1); with `residual` it is added into
        residual in place (in the last expert kernel where no all-reduce comes between) and
        residual is returned."""
        topk_weights, topk_ids = select_experts(router_logits, self.top_k, self.renormalize)
        if self.record_experts is not None:
            self.record_experts(topk_ids)
        topk_ids = self._local_ids(topk_ids)
        all_reduce = self.reduce_results and get_tp_size() > 1
        out = self.quant_method.apply(
            self,
            hidden,
            topk_weights,
            topk_ids,
            dropped_pairs=self.ep_size > 1,
            residual=None if all_reduce else residual,
        )
        if all_reduce:
            out = tensor_model_parallel_all_reduce(out)
            return out if residual is None else residual.add_(out)
        return out

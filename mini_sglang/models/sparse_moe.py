"""The sparse-MoE decoder that Qwen2-MoE, Qwen3-MoE and Mixtral share.

It is the Llama decoder (models/llama.py: attention, norms, residual stream, loading) with
the MLP of the sparse layers replaced by a SparseMoeBlock: a router (`gate`, a replicated
[E, H] linear), the routed experts (layers/moe FusedMoE, `experts`) and, for Qwen2-MoE, a
shared expert scaled by sigmoid(shared_expert_gate(x)). Which layers are sparse follows the
configs: every `decoder_sparse_step`-th layer (1-based) that is not in `mlp_only_layers`
(Qwen; Mixtral's configs have neither, so every layer). Dense layers keep the Llama MLP with
the config's `intermediate_size`.

A family's checkpoint names for an expert's projections are MoeForCausalLM's
`expert_proj_names`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from mini_sglang.distributed.parallel_state import get_tp_size, tensor_model_parallel_all_reduce
from mini_sglang.layers import small_m_gemm
from mini_sglang.layers.moe.layer import FusedMoE
from mini_sglang.models.llama import (
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaMLP,
)
from mini_sglang.models.weight_loading import load_checkpoint_weights

if TYPE_CHECKING:
    from mini_sglang.layers.quantization.base import QuantizationConfig


def moe_settings(config) -> dict:
    """num_experts, intermediate_size (per expert) and renormalize, from a Qwen-MoE config
    (moe_intermediate_size, norm_topk_prob) or a Mixtral one (intermediate_size, always
    renormalised)."""
    if getattr(config, "moe_intermediate_size", None) is None:  # Mixtral
        return dict(
            num_experts=config.num_local_experts,
            intermediate_size=config.intermediate_size,
            renormalize=True,
        )
    return dict(
        num_experts=config.num_experts,
        intermediate_size=config.moe_intermediate_size,
        renormalize=bool(getattr(config, "norm_topk_prob", False)),
    )


def is_sparse_layer(config, layer_id: int) -> bool:
    """transformers' rule: not in mlp_only_layers, and (layer_id + 1) % decoder_sparse_step
    == 0, with experts configured at all."""
    if layer_id in (getattr(config, "mlp_only_layers", None) or []):
        return False
    step = getattr(config, "decoder_sparse_step", 1) or 1
    return moe_settings(config)["num_experts"] > 0 and (layer_id + 1) % step == 0


class SparseMoeBlock(nn.Module):
    """router + routed experts (+ the gated shared expert when shared_intermediate_size > 0);
    one all-reduce for the whole block at tp > 1."""

    def __init__(
        self, config, quant_config: QuantizationConfig | None = None, prefix: str = ""
    ) -> None:
        super().__init__()
        settings = moe_settings(config)
        hidden = config.hidden_size
        self.gate = nn.Linear(hidden, settings["num_experts"], bias=False)
        self.experts = FusedMoE(
            num_experts=settings["num_experts"],
            top_k=config.num_experts_per_tok,
            hidden_size=hidden,
            intermediate_size=settings["intermediate_size"],
            renormalize=settings["renormalize"],
            reduce_results=False,
            quant_config=quant_config,
            prefix=f"{prefix}.experts",
        )
        shared = getattr(config, "shared_expert_intermediate_size", 0) or 0
        self.shared_expert = (
            LlamaMLP(hidden, shared, quant_config, f"{prefix}.shared_expert", reduce_results=False)
            if shared
            else None
        )
        self.shared_expert_gate = nn.Linear(hidden, 1, bias=False) if shared else None

    def router_logits(self, x: torch.Tensor) -> torch.Tensor:
        return small_m_gemm.linear(x, self.gate.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.experts(x, self.router_logits(x))
        if self.shared_expert is not None:
            scale = torch.sigmoid(F.linear(x, self.shared_expert_gate.weight))
            out = out + scale * self.shared_expert(x)
        return tensor_model_parallel_all_reduce(out) if get_tp_size() > 1 else out

    def forward_add_(self, x: torch.Tensor, residual: torch.Tensor) -> None:
        """residual += forward(x); without a shared expert or tensor parallelism the experts
        add into residual themselves (at decode, in the down kernel's epilogue: one kernel
        less per layer, and the step's PDL chain unbroken)."""
        if self.shared_expert is None and get_tp_size() == 1:
            self.experts(x, self.router_logits(x), residual=residual)
        else:
            residual.add_(self.forward(x))


# "experts.<id>.<projection>." in a checkpoint name
_EXPERT_PART = re.compile(r"experts\.\d+\.[^.]+\.")


class MoeDecoderLayer(LlamaDecoderLayer):
    def build_mlp(
        self, config, layer_id: int, quant_config: QuantizationConfig | None, prefix: str
    ) -> nn.Module:
        if is_sparse_layer(config, layer_id):
            return SparseMoeBlock(config, quant_config, prefix)
        return super().build_mlp(config, layer_id, quant_config, prefix)


class MoeForCausalLM(LlamaForCausalLM):
    """The Llama causal LM over MoeDecoderLayer; checkpoints name each expert's projections
    `experts.<e>.<gate|up|down name>.weight`, routed into the stacked expert parameters."""

    decoder_layer_cls = MoeDecoderLayer
    # checkpoint names of an expert's gate, down and up projections
    expert_proj_names = ("gate_proj", "down_proj", "up_proj")

    def __init__(self, config, quant_config: QuantizationConfig | None = None) -> None:
        super().__init__(config, quant_config)
        mapping = FusedMoE.make_expert_params_mapping(
            *self.expert_proj_names, num_experts=moe_settings(config)["num_experts"]
        )
        # checkpoint fragment -> (parameter fragment, expert id, shard id)
        self.expert_params_mapping = {ckpt: (param, e, shard) for param, ckpt, e, shard in mapping}

    def checkpoint_name(self, name: str) -> str:
        """The model's name for a checkpoint tensor's name (a family's renames go here)."""
        return name

    def load_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], strict: bool = True
    ) -> None:
        load_checkpoint_weights(
            self,
            ((self.checkpoint_name(name), tensor) for name, tensor in weights),
            self.stacked_params_mapping,
            self.tie_word_embeddings,
            strict,
            expert_loader=self.load_expert_weight,
        )

    def load_expert_weight(
        self, params: dict[str, nn.Parameter], name: str, tensor: torch.Tensor
    ) -> str | None:
        """Route one expert's projection into the stacked parameter; None if `name` is not
        an expert's tensor."""
        match = _EXPERT_PART.search(name)
        if match is None or match.group(0) not in self.expert_params_mapping:
            return None
        param_part, expert_id, shard_id = self.expert_params_mapping[match.group(0)]
        target = name.replace(match.group(0), param_part)
        param = params.get(target)
        if param is None:  # a tensor the method does not use (a static input_scale)
            return None
        param.weight_loader(param, tensor, shard_id, expert_id)
        return target

"""Qwen2MoeForCausalLM (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's attention (qkv bias) over
sparse-MoE layers with a shared expert gated by sigmoid(shared_expert_gate(x))."""

from __future__ import annotations

from mini_sglang.models.sparse_moe import MoeForCausalLM


class Qwen2MoeForCausalLM(MoeForCausalLM):
    qkv_bias_default = True

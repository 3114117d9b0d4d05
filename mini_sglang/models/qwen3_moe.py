"""Qwen3MoeForCausalLM (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (q/k RMSNorm, no
qkv bias) over sparse-MoE layers (softmax top-k, renormalised when norm_topk_prob)."""

from __future__ import annotations

from mini_sglang.models.sparse_moe import MoeForCausalLM


class Qwen3MoeForCausalLM(MoeForCausalLM):
    qk_norm = True

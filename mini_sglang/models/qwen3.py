"""Qwen3ForCausalLM: the Llama decoder with per-head RMSNorm on q and k (no qkv bias)."""

from __future__ import annotations

from mini_sglang.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True

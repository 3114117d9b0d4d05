"""Qwen2ForCausalLM: the Llama decoder with a bias on the q/k/v projection."""

from __future__ import annotations

from mini_sglang.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    qkv_bias_default = True

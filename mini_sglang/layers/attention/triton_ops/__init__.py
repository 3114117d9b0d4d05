"""Triton kernels of the triton attention backend: split-KV decode and prefix-aware extend,
both reading K/V from the paged pool through req_to_token."""

from __future__ import annotations

from mini_sglang.layers.attention.triton_ops.decode_attention import decode_attention_fwd
from mini_sglang.layers.attention.triton_ops.extend_attention import extend_attention_fwd

__all__ = ["decode_attention_fwd", "extend_attention_fwd"]

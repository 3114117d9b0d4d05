"""RadixAttention: the attention layer models call; the backend does the work.

It holds the per-layer facts the backends need (heads on this rank, head_dim, scaling,
layer_id into the KV pool, and whether extend attention is causal), the layer's KV cache
scales (k_scale, v_scale: plain floats, 1.0 unless the checkpoint or
--quantization-param-path sets them; used only by an FP8 pool, see layers/kv_quant.py) and forwards to `forward_batch.attn_backend`.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from mini_sglang.model_executor.forward_batch_info import ForwardBatch


class AttentionType(Enum):
    """SGLang's attention types. DECODER: a query sees the cached prefix and the new tokens up
    to itself (causal). ENCODER_ONLY: a query sees every token of its sequence (bidirectional;
    the whole sequence is one extend without a cached prefix, and there is no decode)."""

    DECODER = "decoder"
    ENCODER_ONLY = "encoder_only"


class RadixAttention(nn.Module):
    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        scaling: float,
        num_kv_heads: int,
        layer_id: int,
        attn_type: AttentionType = AttentionType.DECODER,
    ) -> None:
        super().__init__()
        self.tp_q_head_num = num_heads
        self.tp_k_head_num = num_kv_heads
        self.tp_v_head_num = num_kv_heads
        self.head_dim = head_dim
        self.scaling = scaling
        self.layer_id = layer_id
        self.attn_type = attn_type
        self.k_scale = 1.0
        self.v_scale = 1.0

    @property
    def is_causal(self) -> bool:
        """Whether extend attention masks keys after each query (every type but
        ENCODER_ONLY)."""
        return self.attn_type != AttentionType.ENCODER_ONLY

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        """k/v may be None with save_kv_cache=False when a fused kernel already wrote them
        into the KV pool."""
        if k is not None:
            k = k.view(-1, self.tp_k_head_num, self.head_dim)
            v = v.view(-1, self.tp_v_head_num, self.head_dim)
        return forward_batch.attn_backend.forward(q, k, v, self, forward_batch, save_kv_cache)

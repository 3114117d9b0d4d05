"""The attention-backend interface and its registry.

A backend is created once per ModelRunner. Before each forward, `init_forward_metadata` plans
whatever every layer will reuse (index tables, masks, flashinfer plans); each RadixAttention
layer then calls `forward`, which writes the new K/V into the pool at `out_cache_loc` and
returns attention output of shape [num_tokens, num_heads * head_dim].
CUDA-graph hooks let the graph runner pre-allocate and replay metadata for decode.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from mini_sglang.config_slices import AttentionConfig
    from mini_sglang.layers.radix_attention import RadixAttention
    from mini_sglang.model_executor.forward_batch_info import ForwardBatch
    from mini_sglang.model_executor.model_runner import ModelRunner


@dataclass(frozen=True)
class QKNormRope:
    """How a model turns its qkv projection into q and k: neox RoPE from cos_sin_cache
    (float32 [max_pos, head_dim], cos then sin, RotaryEmbedding's), preceded by a per-head
    RMSNorm with these weights when they are given (Qwen3)."""

    cos_sin_cache: torch.Tensor
    q_norm_weight: torch.Tensor | None = None
    k_norm_weight: torch.Tensor | None = None
    eps: float = 0.0


class AttentionBackend(ABC):
    @abstractmethod
    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None: ...

    @abstractmethod
    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor: ...

    @abstractmethod
    def forward_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor: ...

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        if forward_batch.forward_mode.is_decode():
            return self.forward_decode(q, k, v, layer, forward_batch, save_kv_cache)
        return self.forward_extend(q, k, v, layer, forward_batch, save_kv_cache)

    def forward_decode_from_qkv(
        self,
        qkv: torch.Tensor,
        positions: torch.Tensor,
        rope: QKNormRope,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor | None:
        """Decode attention straight from the qkv projection's output [bs, (q_heads + 2 *
        kv_heads) * head_dim]: q/k norm and RoPE per `rope`, the new K/V written into the
        pool, output [bs, q_heads * head_dim] as forward_decode's. None where the backend has
        no such kernel; the model then prepares q, k, v itself and calls forward."""
        return None

    # CUDA-graph hooks (decode only); backends without graph support keep the defaults.
    supports_cuda_graph = False

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        raise NotImplementedError

    def init_forward_metadata_capture_cuda_graph(
        self, bs: int, forward_batch: ForwardBatch
    ) -> None:
        raise NotImplementedError

    def init_forward_metadata_replay_cuda_graph(self, bs: int, forward_batch: ForwardBatch) -> None:
        raise NotImplementedError


# name -> factory(runner, AttentionConfig)
ATTENTION_BACKENDS: dict[str, Callable[[ModelRunner, AttentionConfig], AttentionBackend]] = {}


def register_attention_backend(name: str):
    def deco(factory: Callable[[ModelRunner, AttentionConfig], AttentionBackend]):
        ATTENTION_BACKENDS[name] = factory
        return factory

    return deco

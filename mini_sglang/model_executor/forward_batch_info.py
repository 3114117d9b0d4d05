"""ForwardMode and ForwardBatch: what one model forward needs, as device tensors.

The three batch views (SGLang's): ScheduleBatch (scheduler, CPU objects) -> ModelWorkerBatch
(plain data for the worker) -> ForwardBatch (device tensors plus pool and backend handles).

Worked example (EXTEND, two requests): request A has 3 cached prefix tokens and 2 new ones,
request B has 0 cached and 4 new. Then
  extend_prefix_lens = [3, 0], extend_seq_lens = [2, 4], seq_lens = [5, 4],
  input_ids / positions / out_cache_loc have 6 entries: A's positions [3, 4], B's [0, 1, 2, 3],
  extend_start_loc = [0, 2] (where each request's new tokens start in the flat arrays).
For DECODE every request contributes one token at position seq_len - 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, auto
from typing import TYPE_CHECKING, Any

import torch

from mini_sglang.utils.device import to_device

if TYPE_CHECKING:
    from mini_sglang.layers.attention.base_attn_backend import AttentionBackend
    from mini_sglang.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from mini_sglang.multimodal.mm_inputs import MultimodalInputs


class ForwardMode(IntEnum):
    EXTEND = auto()  # prefill, possibly on top of a cached prefix
    DECODE = auto()  # one new token per request
    MIXED = auto()  # a prefill chunk together with running decodes (--enable-mixed-chunk)
    IDLE = auto()  # nothing to run on this rank (data parallel padding)

    def is_extend(self) -> bool:
        return self in (ForwardMode.EXTEND, ForwardMode.MIXED)

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_idle(self) -> bool:
        return self == ForwardMode.IDLE


@dataclass
class ModelWorkerBatch:
    """The worker's view: plain CPU lists/tensors copied out of the ScheduleBatch."""

    forward_mode: ForwardMode
    input_ids: torch.Tensor
    positions: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    out_cache_loc: torch.Tensor
    seq_lens_cpu: torch.Tensor | None = None  # host copy of seq_lens (planning only)
    extend_seq_lens: list[int] | None = None
    extend_prefix_lens: list[int] | None = None
    sampling_info: Any = None
    # Logprob requests: for each request, whether it wants logprobs of its prompt positions.
    return_logprob: bool = False
    extend_logprob_start_lens: list[int] | None = None
    top_logprobs_nums: list[int] | None = None
    token_ids_logprobs: list[list[int] | None] | None = None
    # Extend only: prompt embeddings (float32 [k, hidden]) for extend-token rows
    # input_embeds_loc (int64 [k]), used instead of the embedding table there.
    input_embeds: torch.Tensor | None = None
    input_embeds_loc: torch.Tensor | None = None
    # Extend only: per extend row its MultimodalInputs (None for a text row); None when no
    # row has images (multimodal/mm_inputs.py describes the contract).
    mm_inputs: list[MultimodalInputs | None] | None = None
    # Extend only: int64 [num extend tokens], each token's segment (token type) id, for
    # encoders given text pairs; None means type 0 everywhere.
    token_type_ids: torch.Tensor | None = None


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    out_cache_loc: torch.Tensor
    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool: MHATokenToKVPool
    attn_backend: AttentionBackend
    extend_seq_lens: torch.Tensor | None = None
    extend_prefix_lens: torch.Tensor | None = None
    extend_start_loc: torch.Tensor | None = None
    extend_seq_lens_cpu: list[int] | None = None
    extend_prefix_lens_cpu: list[int] | None = None
    sampling_info: Any = None
    return_logprob: bool = False
    extend_logprob_start_lens: list[int] | None = None
    top_logprobs_nums: list[int] | None = None
    token_ids_logprobs: list[list[int] | None] | None = None
    input_embeds: torch.Tensor | None = None  # see ModelWorkerBatch
    input_embeds_loc: torch.Tensor | None = None
    # Set by an M-RoPE model for an extend whose tokens have M-RoPE positions: float32
    # [num_tokens, head_dim] cos/sin rows, one per token, that the attention reads instead
    # of its RoPE cache; `positions` then index these rows (MRotaryEmbedding.cos_sin_rows).
    rope_cos_sin: torch.Tensor | None = None
    mm_inputs: list[MultimodalInputs | None] | None = None  # see ModelWorkerBatch
    # int64 [3, tokens] M-RoPE positions for models with multimodal rotary embeddings
    # (filled by such a model's runner hook from mm_inputs; None otherwise).
    mrope_positions: torch.Tensor | None = None
    token_type_ids: torch.Tensor | None = None  # see ModelWorkerBatch

    def contains_mm_inputs(self) -> bool:
        return self.mm_inputs is not None and any(m is not None for m in self.mm_inputs)

    @classmethod
    def init_new(
        cls,
        batch: ModelWorkerBatch,
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool: MHATokenToKVPool,
        attn_backend: AttentionBackend,
        device: torch.device | str,
    ) -> ForwardBatch:
        def dev(t: torch.Tensor) -> torch.Tensor:
            return to_device(t, device)

        fb = cls(
            forward_mode=batch.forward_mode,
            batch_size=len(batch.seq_lens),
            input_ids=dev(batch.input_ids),
            positions=dev(batch.positions),
            req_pool_indices=dev(batch.req_pool_indices),
            seq_lens=dev(batch.seq_lens),
            seq_lens_cpu=batch.seq_lens_cpu if batch.seq_lens_cpu is not None else batch.seq_lens,
            out_cache_loc=dev(batch.out_cache_loc),
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool=token_to_kv_pool,
            attn_backend=attn_backend,
            sampling_info=batch.sampling_info,
            return_logprob=batch.return_logprob,
            extend_logprob_start_lens=batch.extend_logprob_start_lens,
            top_logprobs_nums=batch.top_logprobs_nums,
            token_ids_logprobs=batch.token_ids_logprobs,
        )
        if batch.forward_mode.is_extend():
            lens = torch.tensor(batch.extend_seq_lens, dtype=torch.int32)
            fb.extend_seq_lens_cpu = batch.extend_seq_lens
            fb.extend_prefix_lens_cpu = batch.extend_prefix_lens
            fb.extend_seq_lens = dev(lens)
            fb.extend_prefix_lens = dev(torch.tensor(batch.extend_prefix_lens, dtype=torch.int32))
            fb.extend_start_loc = dev(torch.cumsum(lens, 0, dtype=torch.int32) - lens)
            if batch.input_embeds is not None:
                fb.input_embeds = dev(batch.input_embeds)
                fb.input_embeds_loc = dev(batch.input_embeds_loc)
            fb.mm_inputs = batch.mm_inputs
            if batch.token_type_ids is not None:
                fb.token_type_ids = dev(batch.token_type_ids)
        return fb

"""triton: mini-sglang's own Triton attention kernels over the paged KV pool.

Decode runs the two-stage split-KV kernel (triton_ops/decode_attention.py); extend runs one
causal-with-prefix kernel (triton_ops/extend_attention.py), non-causal for encoder-only
layers. Both write the new tokens' K/V into the pool first and then read every key through
req_to_token, so any page size works: the slots of a request are listed per token in
req_to_token whatever the page size.

Per-batch metadata is small and shared by all layers: for decode, the float32 split scratch
(partial outputs and log-sum-exps); for extend, the longest extend length (a host int that
sizes the grid). The kernels take seq_lens / req_pool_indices / extend_* as device tensors
straight from the ForwardBatch, so nothing is read back to the host in forward.

CUDA graphs (decode): the split count is a per-backend constant, the grid depends only on
(batch, heads, splits), and the scratch is preallocated in init_cuda_graph_state. The
captured kernels read the graph runner's static req_pool_indices / seq_lens buffers, which
the runner refills before replay, so replay has nothing else to plan.

FP8 KV cache: the kernels convert pool values to the query dtype as they load them and fold
the layer's k_scale / v_scale into the score scale and the output (layers/kv_quant.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from mini_sglang.distributed.parallel_state import get_tp_size
from mini_sglang.environ import envs
from mini_sglang.layers.attention.base_attn_backend import AttentionBackend, QKNormRope
from mini_sglang.layers.attention.triton_ops import decode_attention_fwd, extend_attention_fwd
from mini_sglang.layers.attention.triton_ops.decode_from_qkv import decode_from_qkv_fwd
from mini_sglang.layers.kernels import pdl_enabled
from mini_sglang.layers.kv_quant import read_scales

if TYPE_CHECKING:
    from mini_sglang.layers.radix_attention import RadixAttention
    from mini_sglang.model_executor.forward_batch_info import ForwardBatch
    from mini_sglang.model_executor.model_runner import ModelRunner

DEFAULT_NUM_KV_SPLITS = 8  # SGLang's --triton-attention-num-kv-splits default
# forward_decode_from_qkv's single kernel (RoPE + K/V store + split-KV stage 1); =1 restores
# the separate qk_norm_rope_store kernel, for A/B runs
_DECODE_FROM_QKV = not envs.MINI_SGLANG_DISABLE_DECODE_FROM_QKV.get()


class TritonAttnBackend(AttentionBackend):
    supports_cuda_graph = True

    def __init__(self, runner: ModelRunner, num_kv_splits: int = DEFAULT_NUM_KV_SPLITS) -> None:
        cfg = runner.model_config
        tp = get_tp_size()
        self.num_q_heads = cfg.num_attention_heads // tp
        self.num_kv_heads = cfg.num_kv_heads_per_rank(tp)
        self.head_dim = cfg.head_dim
        self.device = runner.device
        self.num_kv_splits = num_kv_splits
        self.req_to_token = runner.req_to_token_pool.req_to_token
        # Decode scratch for the current batch: ([bs, H, S, D], [bs, H, S]) float32.
        self.mid: tuple[torch.Tensor, torch.Tensor] | None = None
        self.graph_mid: tuple[torch.Tensor, torch.Tensor] | None = None
        self.max_extend_len = 0

    # ---- planning ------------------------------------------------------------------
    def _alloc_mid(self, bs: int) -> tuple[torch.Tensor, torch.Tensor]:
        h, s = self.num_q_heads, self.num_kv_splits
        f32 = torch.float32
        return (
            torch.empty((bs, h, s, self.head_dim), dtype=f32, device=self.device),
            torch.empty((bs, h, s), dtype=f32, device=self.device),
        )

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        if fb.forward_mode.is_decode():
            self.mid = self._alloc_mid(fb.batch_size)
            return
        self.max_extend_len = max(fb.extend_seq_lens_cpu or [0])

    # ---- kernels -------------------------------------------------------------------
    @staticmethod
    def _save(
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: RadixAttention,
        fb: ForwardBatch,
        save: bool,
    ) -> None:
        if save and k is not None:
            fb.token_to_kv_pool.set_kv_buffer(
                layer.layer_id, fb.out_cache_loc, k, v, layer.k_scale, layer.v_scale
            )

    @staticmethod
    def _heads(q: torch.Tensor, layer: RadixAttention) -> torch.Tensor:
        q = q.view(-1, layer.tp_q_head_num, layer.head_dim)
        return q if q.stride(-1) == 1 else q.contiguous()

    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        fb: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        self._save(k, v, layer, fb, save_kv_cache)
        k_buf, v_buf = fb.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        q = self._heads(q, layer)
        o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        extend_attention_fwd(
            q,
            o,
            k_buf,
            v_buf,
            self.req_to_token,
            fb.req_pool_indices,
            fb.seq_lens,
            fb.extend_seq_lens,
            fb.extend_start_loc,
            self.max_extend_len,
            layer.scaling,
            causal=layer.is_causal,
            **read_scales(layer, k_buf.dtype),
        )
        return o.view(-1, layer.tp_q_head_num * layer.head_dim)

    def forward_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: RadixAttention,
        fb: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        self._save(k, v, layer, fb, save_kv_cache)
        k_buf, v_buf = fb.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        q = self._heads(q, layer)
        bs = q.shape[0]
        o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        assert self.mid is not None and self.mid[0].shape[0] >= bs, "decode metadata not set"
        mid_o, mid_lse = self.mid
        decode_attention_fwd(
            q,
            k_buf,
            v_buf,
            o,
            self.req_to_token,
            fb.req_pool_indices,
            fb.seq_lens,
            mid_o,
            mid_lse,
            layer.scaling,
            pdl=pdl_enabled(q),
            **read_scales(layer, k_buf.dtype),
        )
        return o.view(-1, layer.tp_q_head_num * layer.head_dim)

    def forward_decode_from_qkv(
        self,
        qkv: torch.Tensor,
        positions: torch.Tensor,
        rope: QKNormRope,
        layer: RadixAttention,
        fb: ForwardBatch,
    ) -> torch.Tensor | None:
        d = layer.head_dim
        if not _DECODE_FROM_QKV or d & (d - 1) or qkv.stride(-1) != 1:
            return None
        k_buf, v_buf = fb.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        bs = qkv.shape[0]
        o = torch.empty((bs, layer.tp_q_head_num, d), dtype=qkv.dtype, device=qkv.device)
        assert self.mid is not None and self.mid[0].shape[0] >= bs, "decode metadata not set"
        decode_from_qkv_fwd(
            qkv,
            positions,
            rope,
            fb.out_cache_loc,
            k_buf,
            v_buf,
            o,
            self.req_to_token,
            fb.req_pool_indices,
            fb.seq_lens,
            *self.mid,
            layer.scaling,
            pdl=pdl_enabled(qkv),
            **read_scales(layer, k_buf.dtype),
        )
        return o.view(bs, -1)

    # ---- CUDA graphs (decode) ------------------------------------------------------
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self.graph_mid = self._alloc_mid(max_bs)

    def _use_graph_mid(self, bs: int) -> None:
        assert self.graph_mid is not None, "init_cuda_graph_state was not called"
        self.mid = (self.graph_mid[0][:bs], self.graph_mid[1][:bs])

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        self._use_graph_mid(bs)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        # The captured kernels read fb.req_pool_indices / fb.seq_lens (the runner's static
        # buffers, already refilled) and the preallocated scratch: nothing to recompute.
        self._use_graph_mid(bs)

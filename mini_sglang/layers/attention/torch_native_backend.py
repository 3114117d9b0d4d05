"""torch_native: scaled_dot_product_attention over K/V gathered through req_to_token.

Runs on CPU and CUDA and is the correctness reference for the GPU backends.
Decode batches every request into one SDPA call, padding K/V to the longest sequence with a
key mask; extend runs one SDPA call per request with an explicit causal mask offset by the
cached prefix (SDPA's own is_causal aligns top-left, which is wrong when q_len < kv_len), or
with no mask at all for an ENCODER_ONLY layer (every query sees every key of its request).
An FP8 pool's K/V are dequantized with the layer's scales as they are gathered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from mini_sglang.layers.attention.base_attn_backend import (
    AttentionBackend,
    register_attention_backend,
)
from mini_sglang.layers.kv_quant import dequantize_kv, gather_kv

if TYPE_CHECKING:
    from mini_sglang.config_slices import AttentionConfig
    from mini_sglang.layers.radix_attention import RadixAttention
    from mini_sglang.model_executor.forward_batch_info import ForwardBatch
    from mini_sglang.model_executor.model_runner import ModelRunner


class TorchNativeAttnBackend(AttentionBackend):
    def __init__(self, runner: ModelRunner) -> None:
        self.device = runner.device
        self._meta: dict = {}

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        req_to_token = fb.req_to_token_pool.req_to_token
        if fb.forward_mode.is_decode():
            # [B, L] KV-slot table padded with slot 0 plus a key mask [B, 1, 1, L].
            max_len = int(fb.seq_lens_cpu.max())
            kv_idx = req_to_token[fb.req_pool_indices, :max_len].long()
            arange = torch.arange(max_len, device=kv_idx.device)
            valid = arange[None, :] < fb.seq_lens[:, None]
            self._meta = {"kv_idx": kv_idx.masked_fill(~valid, 0), "mask": valid[:, None, None, :]}
            return
        per_req = []
        start = 0
        seq_lens = fb.seq_lens_cpu.tolist()
        pool_idx = fb.req_pool_indices.tolist()
        for i, ext in enumerate(fb.extend_seq_lens_cpu):
            total = seq_lens[i]
            prefix = total - ext
            kv_idx = req_to_token[pool_idx[i], :total].long()
            # Query j sits at absolute position prefix + j and sees keys 0..prefix + j.
            q_pos = torch.arange(prefix, total, device=kv_idx.device)
            k_pos = torch.arange(total, device=kv_idx.device)
            mask = k_pos[None, :] <= q_pos[:, None]
            per_req.append((start, ext, kv_idx, mask))
            start += ext
        self._meta = {"per_req": per_req}

    def _save(self, k, v, layer: RadixAttention, fb: ForwardBatch, save: bool) -> None:
        if save and k is not None:
            fb.token_to_kv_pool.set_kv_buffer(
                layer.layer_id, fb.out_cache_loc, k, v, layer.k_scale, layer.v_scale
            )

    @staticmethod
    def _gather(buf, idx, scale: float, dtype):
        """buf[idx] as `dtype`, dequantized when the pool is FP8."""
        return dequantize_kv(gather_kv(buf, idx), scale, dtype)

    def forward_extend(self, q, k, v, layer, fb, save_kv_cache=True):
        self._save(k, v, layer, fb, save_kv_cache)
        k_buf, v_buf = fb.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        q = q.view(-1, layer.tp_q_head_num, layer.head_dim)
        out = torch.empty_like(q)
        for start, ext, kv_idx, mask in self._meta["per_req"]:
            if ext == 0:
                continue
            qi = q[start : start + ext].transpose(0, 1)  # [H, ext, D]
            ki = self._gather(k_buf, kv_idx, layer.k_scale, q.dtype).transpose(0, 1)
            vi = self._gather(v_buf, kv_idx, layer.v_scale, q.dtype).transpose(0, 1)
            oi = F.scaled_dot_product_attention(
                qi.unsqueeze(0),
                ki.unsqueeze(0),
                vi.unsqueeze(0),
                attn_mask=mask if layer.is_causal else None,
                scale=layer.scaling,
                enable_gqa=layer.tp_q_head_num != layer.tp_k_head_num,
            )
            out[start : start + ext] = oi[0].transpose(0, 1)
        return out.view(-1, layer.tp_q_head_num * layer.head_dim)

    def forward_decode(self, q, k, v, layer, fb, save_kv_cache=True):
        self._save(k, v, layer, fb, save_kv_cache)
        k_buf, v_buf = fb.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        kv_idx, mask = self._meta["kv_idx"], self._meta["mask"]
        bs = kv_idx.shape[0]
        qb = q.view(bs, layer.tp_q_head_num, 1, layer.head_dim)
        kb = self._gather(k_buf, kv_idx, layer.k_scale, q.dtype).transpose(1, 2)  # [B, KH, L, D]
        vb = self._gather(v_buf, kv_idx, layer.v_scale, q.dtype).transpose(1, 2)
        out = F.scaled_dot_product_attention(
            qb,
            kb,
            vb,
            attn_mask=mask,
            scale=layer.scaling,
            enable_gqa=layer.tp_q_head_num != layer.tp_k_head_num,
        )
        return out.reshape(bs, layer.tp_q_head_num * layer.head_dim)


@register_attention_backend("torch_native")
def _create(runner: ModelRunner, config: AttentionConfig) -> AttentionBackend:
    return TorchNativeAttnBackend(runner)

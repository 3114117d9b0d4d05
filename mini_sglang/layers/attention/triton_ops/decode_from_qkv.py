"""Split-KV decode attention that starts from the qkv projection's output.

One kernel replaces, per layer and decode step, the q/k-norm + RoPE + K/V-store kernel
(layers/fused_kernels.qk_norm_rope_store) and stage 1 of decode_attention.py; stage 2 (the
merge of the splits) is shared with that file. At batch 1 a decode step's attention is
latency, not bandwidth (Llama-3.1-8B, H100: ~10 us per layer for ~2.6 MB of keys), so the
point is what happens before the wait on the previous kernel (PDL, see fused_kernels.py):

    before gdc_wait: the request's length, slots and position and the first key block of
                     the split, which only earlier steps wrote (a step writes just its new
                     token's K/V)
    after gdc_wait:  the query heads and the new token's k and v, read from qkv, normalised
                     (Qwen3) and rotated in registers; the new token joins the softmax from
                     registers and the split that holds it writes it into the pool.

Grid and split arithmetic are decode_attention.py's (its docstring has a worked example):
program (b, kv_head * head_blocks + j, s) takes request b, query heads j*BLOCK_H.. of that
kv head's group and split s of keys [start, end); the new token is key seq_len - 1, so the
pool is read over [start, min(end, seq_len - 1)) and the split with start <= seq_len - 1 < end
adds the new token. Example, seq_len 130, 4 splits of 64: split 2 covers [128, 130), reads
key 128 from the pool and takes key 129 from qkv; split 3 is empty.

Neox RoPE on a head x of width D, in one pass over [R, D] tiles: with partner(i) = (i + D/2)
mod D and c, s the cos / sin of frequency i mod D/2,
    out[i] = x[i] * c - x[partner(i)] * s   (i < D/2),   x[i] * c + x[partner(i)] * s   (else),
which is fused_kernels' (x1 * cos - x2 * sin, x2 * cos + x1 * sin) with the partner read as a
second, permuted load instead of splitting the tile in halves.

With an FP8 pool the new token's k and v are quantized as fused_kernels stores them, and
the softmax runs on the stored (quantized) values, as it would read them back from the
pool: k_scale folded into the score scale, v_scale applied by the merge (decode_attention.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mini_sglang.layers.attention.base_attn_backend import QKNormRope
from mini_sglang.layers.attention.triton_ops.decode_attention import (
    BLOCK_H,
    LOG2E,
    MIN_BLOCK_KV,
    _dot,
    merge_splits,
    pool_and_scratch_strides,
)
from mini_sglang.layers.kernels import gdc_launch_dependents, gdc_wait, kv_to_pool_units
from mini_sglang.layers.kv_quant import fp8_max

_NUM_WARPS = 4


@triton.jit
def _rope_table(pos, cos_sin, offs_d, D: tl.constexpr):
    """cos and sin [1, D] of each column's frequency at position pos (neox: column i and its
    partner share frequency i mod D/2), loaded once for the query and key heads alike."""
    freq = offs_d % (D // 2)
    cos = tl.load(cos_sin + pos * D + freq)[None, :]
    sin = tl.load(cos_sin + pos * D + D // 2 + freq)[None, :]
    return cos, sin


@triton.jit
def _norm_rope(row, heads, mask_h, offs_d, cos, sin, norm_w, eps, D: tl.constexpr,
               HAS_NORM: tl.constexpr):  # fmt: skip
    """Heads `heads` [R] of one token's qkv row, RMS-normalised with norm_w when HAS_NORM,
    rotated by the table cos / sin (_rope_table; neox, module docstring); float32 [R, D]."""
    half: tl.constexpr = D // 2
    partner = (offs_d + half) % D
    cols = heads[:, None] * D
    x = tl.load(row + cols + offs_d[None, :], mask=mask_h[:, None], other=0.0).to(tl.float32)
    xp = tl.load(row + cols + partner[None, :], mask=mask_h[:, None], other=0.0).to(tl.float32)
    if HAS_NORM:
        r = 1.0 / tl.sqrt(tl.sum(x * x, 1) / D + eps)
        x = x * r[:, None] * tl.load(norm_w + offs_d).to(tl.float32)[None, :]
        xp = xp * r[:, None] * tl.load(norm_w + partner).to(tl.float32)[None, :]
    return tl.where(offs_d[None, :] < half, x * cos - xp * sin, x * cos + xp * sin)


@triton.jit
def _load_kv_block(slots, offs_n, mask_n, K, V, stride_kn, stride_vn, offs_d):
    """K [D, N] and V [N, D] of keys offs_n (masked by mask_n) through a req_to_token row."""
    slot = tl.load(slots + offs_n, mask=mask_n, other=0).to(tl.int64)
    k = tl.load(K + slot[None, :] * stride_kn + offs_d[:, None], mask=mask_n[None, :], other=0.0)
    v = tl.load(V + slot[:, None] * stride_vn + offs_d[None, :], mask=mask_n[:, None], other=0.0)
    return k, v


@triton.jit
def _decode_from_qkv_stage1(
    QKV, positions, cos_sin, q_w, k_w, eps, loc, K, V, req_to_token, req_pool_indices, seq_lens,
    Mid_O, Mid_Lse, qk_scale, inv_k_scale, inv_v_scale, stride_qkv, stride_kn, stride_kh,
    stride_vn, stride_vh, stride_r2t, stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
    NUM_Q: tl.constexpr, NUM_KV: tl.constexpr, GROUP: tl.constexpr, HEAD_BLOCKS: tl.constexpr,
    NUM_SPLITS: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    MIN_KV: tl.constexpr, HAS_NORM: tl.constexpr, FP8_MAX: tl.constexpr, IEEE: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    kv_head = tl.program_id(1) // HEAD_BLOCKS
    head_block = tl.program_id(1) % HEAD_BLOCKS
    h_in_group = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = h_in_group < GROUP
    heads = kv_head * GROUP + h_in_group
    split = tl.program_id(2)
    offs_d = tl.arange(0, D)

    # Written before this step's first kernel ran: lengths, slots, earlier tokens' K/V.
    seq_len = tl.load(seq_lens + b).to(tl.int32)
    slots = req_to_token + tl.load(req_pool_indices + b).to(tl.int64) * stride_r2t
    new = seq_len - 1
    per_split = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), MIN_KV) * MIN_KV
    start = split * per_split
    end = tl.minimum(start + per_split, seq_len)
    end_pool = tl.minimum(end, new)
    Kh = K + kv_head * stride_kh
    Vh = V + kv_head * stride_vh
    offs_n = start + tl.arange(0, BLOCK_N)
    k, v = _load_kv_block(slots, offs_n, offs_n < end_pool, Kh, Vh, stride_kn, stride_vn, offs_d)
    # The position is set before the step too: loaded here, the cos/sin loads that depend
    # on it issue right after the wait beside the qkv row's, one load deep instead of two.
    # (cos/sin themselves before the wait cost 5-6 registers, and Qwen3's 8-KV-head
    # programs their third slot per SM: 170 registers against 165, sm90.)
    pos = tl.load(positions + b)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    cos, sin = _rope_table(pos, cos_sin, offs_d, D)

    row = QKV + b * stride_qkv
    q = _norm_rope(row, heads, mask_h, offs_d, cos, sin, q_w, eps, D, HAS_NORM)
    q = q.to(QKV.dtype.element_ty)  # rounded as the query the unfused path stores
    one = tl.arange(0, 1)
    k_new = _norm_rope(row, NUM_Q + kv_head + one, one < 1, offs_d, cos, sin, k_w, eps, D,
                       HAS_NORM)  # fmt: skip
    k_new = kv_to_pool_units(k_new, inv_k_scale, FP8_MAX).to(K.dtype.element_ty)
    v_new = tl.load(row + (NUM_Q + NUM_KV + kv_head) * D + one[:, None] * D + offs_d[None, :])
    v_new = kv_to_pool_units(v_new, inv_v_scale, FP8_MAX).to(V.dtype.element_ty)
    holds_new = (start <= new) & (new < end)
    if holds_new & (head_block == 0):
        slot = tl.load(loc + b).to(tl.int64)
        tl.store(Kh + slot * stride_kn + one[:, None] * D + offs_d[None, :], k_new)
        tl.store(Vh + slot * stride_vn + one[:, None] * D + offs_d[None, :], v_new)

    # Online softmax (base 2), seeded with the new token where this split holds it.
    s_new = tl.sum(q.to(tl.float32) * k_new.to(tl.float32), 1) * qk_scale  # [BLOCK_H]
    m_i = tl.where(holds_new, s_new, float("-inf"))
    l_i = tl.where(holds_new, 1.0, 0.0) + tl.zeros([BLOCK_H], tl.float32)
    acc = tl.where(holds_new, v_new.to(tl.float32), 0.0) + tl.zeros([BLOCK_H, D], tl.float32)
    for n0 in range(start, end_pool, BLOCK_N):
        visible = (n0 + tl.arange(0, BLOCK_N)) < end_pool
        s = _dot(q, k.to(q.dtype), IEEE) * qk_scale
        s = tl.where(visible[None, :], s, float("-inf"))
        m_next = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_next)
        p = tl.exp2(s - m_next[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + _dot(p.to(q.dtype), v.to(q.dtype), IEEE)
        m_i = m_next
        offs_n = n0 + BLOCK_N + tl.arange(0, BLOCK_N)
        k, v = _load_kv_block(slots, offs_n, offs_n < end_pool, Kh, Vh, stride_kn, stride_vn,
                              offs_d)  # fmt: skip

    nonempty = l_i > 0
    o = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    lse = tl.where(nonempty, m_i + tl.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
    tl.store(
        Mid_O + b * stride_ob + heads[:, None] * stride_oh + split * stride_os + offs_d[None, :],
        o,
        mask=mask_h[:, None],
    )
    tl.store(Mid_Lse + b * stride_lb + heads * stride_lh + split, lse, mask=mask_h)


def decode_from_qkv_fwd(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    rope: QKNormRope,
    out_cache_loc: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    o: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    mid_o: torch.Tensor,
    mid_lse: torch.Tensor,
    sm_scale: float,
    pdl: bool = False,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Decode attention for `bs` requests from their qkv rows, written into `o`.

    qkv: [bs, (q_heads + 2 * kv_heads) * head_dim], rows [q heads | k heads | v heads], last
    dim contiguous; positions, out_cache_loc: [bs] (the new token's position and KV slot);
    rope: the RoPE cos/sin cache and optional q/k norm; o: [bs, q_heads, head_dim]; the rest as
    decode_attention_fwd, whose seq_lens count the new token. head_dim must be a power of two.
    The new token's K/V are written into the pool at out_cache_loc, as qk_norm_rope_store
    would (quantized with k_scale / v_scale into an FP8 pool; the read side applies the same
    scales); its key slot in req_to_token is not read.
    """
    bs, q_heads, head_dim = o.shape
    if bs == 0:
        return
    assert head_dim == triton.next_power_of_2(head_dim), head_dim
    kv_heads = k_buffer.shape[1]
    group = q_heads // kv_heads
    num_splits = mid_lse.shape[2]
    head_blocks = triton.cdiv(group, BLOCK_H)
    has_norm = rope.q_norm_weight is not None
    cos_sin = rope.cos_sin_cache
    _decode_from_qkv_stage1[(bs, kv_heads * head_blocks, num_splits)](
        qkv,
        positions,
        cos_sin,
        rope.q_norm_weight if has_norm else cos_sin,  # unread without HAS_NORM
        rope.k_norm_weight if has_norm else cos_sin,
        rope.eps,
        out_cache_loc,
        k_buffer,
        v_buffer,
        req_to_token,
        req_pool_indices,
        seq_lens,
        mid_o,
        mid_lse,
        sm_scale * k_scale * LOG2E,
        1.0 / k_scale,
        1.0 / v_scale,
        qkv.stride(0),
        *pool_and_scratch_strides(k_buffer, v_buffer, req_to_token, mid_o, mid_lse),
        NUM_Q=q_heads,
        NUM_KV=kv_heads,
        GROUP=group,
        HEAD_BLOCKS=head_blocks,
        NUM_SPLITS=num_splits,
        D=head_dim,
        BLOCK_H=BLOCK_H,
        BLOCK_N=32 if head_dim > 128 else 64,
        MIN_KV=MIN_BLOCK_KV,
        HAS_NORM=has_norm,
        FP8_MAX=fp8_max(k_buffer.dtype),
        IEEE=qkv.dtype == torch.float32,
        PDL=pdl,
        num_warps=_NUM_WARPS,
        num_stages=1,  # the next key block is loaded by hand, one iteration ahead
        launch_pdl=pdl,
    )
    merge_splits(mid_o, mid_lse, o, pdl, v_scale)

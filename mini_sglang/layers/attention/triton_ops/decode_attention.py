"""Split-KV decode attention over the paged KV pool (one query token per request).

Stage 1 (`_decode_stage1`): grid (batch, kv_heads * head_blocks, num_kv_splits). A program
takes one request, one block of up to BLOCK_H query heads that share a KV head (GQA), and
one contiguous chunk ("split") of that request's keys; it writes the split's softmax-
normalised partial output and its log-sum-exp (base 2) to float32 scratch buffers.
Stage 2 (`_decode_stage2`): grid (batch, q_heads). Merges the splits:
    out = sum_s 2^(lse_s - M) * o_s / sum_s 2^(lse_s - M),   M = max_s lse_s.

Keys are read straight through req_to_token: key j of request b lives in KV slot
req_to_token[req_pool_indices[b], j]; that row already is the token-level index list, so
no kv_indices copy is built. Split sizes are derived on the device from seq_lens, and the
grid depends only on (batch, heads, num_kv_splits), so both stages are CUDA-graph-safe.

An FP8 pool's values are converted to the query's dtype as they are loaded (exactly: every
FP8 value is a bfloat16 / float16 value) and its scales are folded: k_scale into the score
scale, v_scale into the merged output (see layers/kv_quant.py).

Worked example of the split arithmetic (MIN_BLOCK_KV = 32, 4 splits, seq_len 130):
per_split = ceil(ceil(130 / 4) / 32) * 32 = ceil(33 / 32) * 32 = 64, so the splits cover
[0, 64), [64, 128), [128, 130) and [192, 130) = empty. An empty split stores lse = -inf
and o = 0, which stage 2 weighs by 2^-inf = 0.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mini_sglang.layers.kernels import gdc_launch_dependents, gdc_wait

LOG2E = 1.4426950408889634
MIN_BLOCK_KV = 32  # split lengths are multiples of this
# query heads per stage-1 program: tl.dot needs M >= 16, so with GROUP < 16 the extra rows
# are masked off, and GROUP > 16 takes ceil(GROUP / 16) programs per kv head
BLOCK_H = 16


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    """a @ b with fp32 accumulation; IEEE (for float32 inputs) avoids TF32 rounding."""
    # IEEE is constexpr: Triton compiles only the branch taken.
    return tl.dot(a, b, input_precision="ieee") if IEEE else tl.dot(a, b)


@triton.jit
def _attend_key_block(
    q, acc, m_i, l_i, visible, offs_n, mask_n, req_slots, K, V, stride_kn, stride_vn,
    offs_d, mask_d, qk_scale, IEEE: tl.constexpr,
):  # fmt: skip
    """One key block of online softmax, shared by the decode and extend kernels: gather the
    block's K/V through the request's req_to_token row (`req_slots`), score the query rows
    q [M, D] (exp2 domain: qk_scale includes log2(e)), keep scores where `visible` [M, N]
    and fold them into the running max m_i, denominator l_i and output acc [M, D]."""
    slot = tl.load(req_slots + offs_n, mask=mask_n, other=0).to(tl.int64)
    k = tl.load(
        K + slot[None, :] * stride_kn + offs_d[:, None],
        mask=mask_n[None, :] & mask_d[:, None],
        other=0.0,
    ).to(q.dtype)  # [BLOCK_D, BLOCK_N]
    s = _dot(q, k, IEEE) * qk_scale
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(
        V + slot[:, None] * stride_vn + offs_d[None, :],
        mask=mask_n[:, None] & mask_d[None, :],
        other=0.0,
    ).to(q.dtype)  # [BLOCK_N, BLOCK_D]
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE)
    return acc, m_new, l_i


@triton.jit
def _decode_stage1(
    Q,
    K,
    V,
    req_to_token,
    req_pool_indices,
    seq_lens,
    Mid_O,
    Mid_Lse,
    qk_scale,  # sm_scale * log2(e): scores are kept in base 2
    stride_qb,
    stride_qh,
    stride_kn,
    stride_kh,
    stride_vn,
    stride_vh,
    stride_r2t,
    stride_ob,
    stride_oh,
    stride_os,
    stride_lb,
    stride_lh,
    GROUP: tl.constexpr,  # q heads per kv head
    HEAD_BLOCKS: tl.constexpr,  # ceil(GROUP / BLOCK_H) programs per kv head
    NUM_SPLITS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MIN_KV: tl.constexpr,
    IEEE: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:  # everything this kernel reads may come from the kernel before it
        gdc_launch_dependents()
        gdc_wait()
    b = tl.program_id(0)
    kv_head = tl.program_id(1) // HEAD_BLOCKS
    h_in_group = (tl.program_id(1) % HEAD_BLOCKS) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = h_in_group < GROUP
    heads = kv_head * GROUP + h_in_group
    split = tl.program_id(2)

    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    seq_len = tl.load(seq_lens + b).to(tl.int32)
    row = tl.load(req_pool_indices + b).to(tl.int64)
    per_split = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), MIN_KV) * MIN_KV
    start = split * per_split
    end = tl.minimum(start + per_split, seq_len)

    q = tl.load(
        Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
        mask=mask_h[:, None] & mask_d[None, :],
        other=0.0,
    )
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        acc, m_i, l_i = _attend_key_block(
            q, acc, m_i, l_i, mask_n[None, :], offs_n, mask_n, req_to_token + row * stride_r2t,
            K + kv_head * stride_kh, V + kv_head * stride_vh, stride_kn, stride_vn,
            offs_d, mask_d, qk_scale, IEEE,
        )  # fmt: skip

    nonempty = l_i > 0
    o = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    lse = tl.where(nonempty, m_i + tl.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
    tl.store(
        Mid_O + b * stride_ob + heads[:, None] * stride_oh + split * stride_os + offs_d[None, :],
        o,
        mask=mask_h[:, None] & mask_d[None, :],
    )
    tl.store(Mid_Lse + b * stride_lb + heads * stride_lh + split, lse, mask=mask_h)


@triton.jit
def _decode_stage2(
    Mid_O,
    Mid_Lse,
    Out,
    stride_ob,
    stride_oh,
    stride_os,
    stride_lb,
    stride_lh,
    stride_out_b,
    stride_out_h,
    v_scale,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_s = offs_s < NUM_SPLITS
    mask_d = offs_d < HEAD_DIM
    lse = tl.load(
        Mid_Lse + b * stride_lb + h * stride_lh + offs_s, mask=mask_s, other=float("-inf")
    )
    o = tl.load(
        Mid_O + b * stride_ob + h * stride_oh + offs_s[:, None] * stride_os + offs_d[None, :],
        mask=mask_s[:, None] & mask_d[None, :],
        other=0.0,
    )
    w = tl.exp2(lse - tl.max(lse, 0))  # split 0 is never empty (seq_len >= 1): max is finite
    out = tl.sum(w[:, None] * o, 0) / tl.sum(w, 0) * v_scale
    tl.store(
        Out + b * stride_out_b + h * stride_out_h + offs_d,
        out.to(Out.dtype.element_ty),
        mask=mask_d,
    )


def decode_attention_fwd(
    q: torch.Tensor,
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
    """Decode attention for `bs` requests, one query token each, written into `o`.

    q, o: [bs, q_heads, head_dim] (last dim contiguous); k_buffer, v_buffer: the layer's
    pool [num_slots, kv_heads, head_dim]; req_to_token: [max_reqs, max_context] int32;
    req_pool_indices, seq_lens: [bs] device ints (seq_lens counts the new token, whose K/V
    must already be in the pool); mid_o: [>=bs, q_heads, num_splits, head_dim] float32 and
    mid_lse: [>=bs, q_heads, num_splits] float32 scratch, whose dim 2 sets the split count.
    Every seq_len must be >= 1. Nothing is read back to the host. pdl=True launches both
    stages as programmatic dependents (see layers/fused_kernels.py). k_scale / v_scale: the
    pool's dequantization scales (1.0 for a pool in the model dtype).
    """
    bs, q_heads, head_dim = q.shape
    if bs == 0:
        return
    kv_heads = k_buffer.shape[1]
    group = q_heads // kv_heads
    num_splits = mid_lse.shape[2]
    head_blocks = triton.cdiv(group, BLOCK_H)
    block_d = max(16, triton.next_power_of_2(head_dim))
    _decode_stage1[(bs, kv_heads * head_blocks, num_splits)](
        q,
        k_buffer,
        v_buffer,
        req_to_token,
        req_pool_indices,
        seq_lens,
        mid_o,
        mid_lse,
        sm_scale * k_scale * LOG2E,
        q.stride(0),
        q.stride(1),
        *pool_and_scratch_strides(k_buffer, v_buffer, req_to_token, mid_o, mid_lse),
        GROUP=group,
        HEAD_BLOCKS=head_blocks,
        NUM_SPLITS=num_splits,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_H=BLOCK_H,
        BLOCK_N=32 if block_d > 128 else 64,
        MIN_KV=MIN_BLOCK_KV,
        IEEE=q.dtype == torch.float32,
        PDL=pdl,
        num_warps=4,
        num_stages=2,
        launch_pdl=pdl,
    )
    merge_splits(mid_o, mid_lse, o, pdl, v_scale)


def pool_and_scratch_strides(
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    mid_o: torch.Tensor,
    mid_lse: torch.Tensor,
) -> tuple[int, ...]:
    """The stride arguments that stage-1 kernels take after their query strides, in order:
    K (slot, head), V (slot, head), req_to_token (row), mid_o (b, h, split), mid_lse (b, h)."""
    return (
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        req_to_token.stride(0),
        mid_o.stride(0),
        mid_o.stride(1),
        mid_o.stride(2),
        mid_lse.stride(0),
        mid_lse.stride(1),
    )


def merge_splits(
    mid_o: torch.Tensor, mid_lse: torch.Tensor, o: torch.Tensor, pdl: bool, v_scale: float = 1.0
) -> None:
    """Stage 2: o [bs, q_heads, head_dim] from the splits' partial outputs and log-sum-exps
    (stage 1's scratch, see decode_attention_fwd), times v_scale (an FP8 pool's V scale)."""
    bs, q_heads, head_dim = o.shape
    num_splits = mid_lse.shape[2]
    block_d = max(16, triton.next_power_of_2(head_dim))
    _decode_stage2[(bs, q_heads)](
        mid_o,
        mid_lse,
        o,
        mid_o.stride(0),
        mid_o.stride(1),
        mid_o.stride(2),
        mid_lse.stride(0),
        mid_lse.stride(1),
        o.stride(0),
        o.stride(1),
        v_scale,
        NUM_SPLITS=num_splits,
        BLOCK_S=triton.next_power_of_2(num_splits),
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        PDL=pdl,
        num_warps=4 if block_d > 64 else 2,
        launch_pdl=pdl,
    )

"""Extend (prefill) attention over the paged KV pool, with a cached prefix.

The new tokens' K/V are written to the pool before this kernel runs, so every key — cached
prefix and new token alike — is read through req_to_token. Request b has seq_len keys of
which the last ext are new; its new query j (0 <= j < ext) sits at absolute position
prefix + j (prefix = seq_len - ext) and attends to keys 0 .. prefix + j: the whole prefix
plus a causal window over the new tokens. An FP8 pool is read as decode_attention.py reads
it (k_scale folded into the score scale, v_scale into the output).

Grid (ceil(max_ext / BLOCK_M), batch, q_heads): a program takes BLOCK_M consecutive new
queries of one request and one head and runs an online softmax over key blocks up to the
block's last visible key. Worked example: prefix 5, ext 3, BLOCK_M = 2. Program m = 0 holds
queries j = 0, 1 (positions 5, 6) and reads keys [0, 7): row j = 0 sees keys 0..5, row
j = 1 keys 0..6. Program m = 1 holds j = 2 (position 7; its second row is padding past
ext) and reads keys [0, 8).

Non-causal (CAUSAL=False, encoder-only layers): every query row of request b sees all
seq_len keys of b, so each program reads keys [0, seq_len) with no position mask.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mini_sglang.layers.attention.triton_ops.decode_attention import LOG2E, _attend_key_block


@triton.jit
def _extend_kernel(
    Q,
    Out,
    K,
    V,
    req_to_token,
    req_pool_indices,
    seq_lens,
    extend_seq_lens,
    extend_start_loc,
    qk_scale,  # sm_scale * k_scale * log2(e)
    v_scale,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kn,
    stride_kh,
    stride_vn,
    stride_vh,
    stride_r2t,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    m_blk = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)
    kv_head = h // GROUP
    ext = tl.load(extend_seq_lens + b).to(tl.int32)
    if m_blk * BLOCK_M < ext:
        seq_len = tl.load(seq_lens + b).to(tl.int32)
        prefix = seq_len - ext
        q_start = tl.load(extend_start_loc + b).to(tl.int64)
        row = tl.load(req_pool_indices + b).to(tl.int64)

        offs_m = m_blk * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        mask_m = offs_m < ext
        mask_d = offs_d < HEAD_DIM
        q_tok = q_start + offs_m
        q = tl.load(
            Q + q_tok[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
            mask=mask_m[:, None] & mask_d[None, :],
            other=0.0,
        )
        q_pos = prefix + offs_m  # absolute position of each query row

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        kv_end = tl.minimum(seq_len, prefix + (m_blk + 1) * BLOCK_M) if CAUSAL else seq_len
        # The first key block holds key 0, visible to every row, so m_i is finite after it.
        for n0 in range(0, kv_end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            mask_n = offs_n < kv_end
            if CAUSAL:
                visible = mask_n[None, :] & (offs_n[None, :] <= q_pos[:, None])
            else:
                visible = mask_n[None, :] & (q_pos[:, None] >= 0)
            acc, m_i, l_i = _attend_key_block(
                q, acc, m_i, l_i, visible, offs_n, mask_n, req_to_token + row * stride_r2t,
                K + kv_head * stride_kh, V + kv_head * stride_vh, stride_kn, stride_vn,
                offs_d, mask_d, qk_scale, IEEE,
            )  # fmt: skip

        out = acc / l_i[:, None] * v_scale
        tl.store(
            Out + q_tok[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
            out.to(Out.dtype.element_ty),
            mask=mask_m[:, None] & mask_d[None, :],
        )


def extend_attention_fwd(
    q: torch.Tensor,
    o: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_extend_len: int,
    sm_scale: float,
    causal: bool = True,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Causal-with-prefix attention for a batch of extends, written into `o`; with
    causal=False every new query of request b attends to all seq_len keys of b instead
    (encoder-only layers).

    q, o: [num_new_tokens, q_heads, head_dim] (last dim contiguous), the new tokens of all
    requests concatenated; request b's rows start at extend_start_loc[b] and number
    extend_seq_lens[b]. k_buffer, v_buffer: the layer's pool [num_slots, kv_heads, head_dim],
    already holding the new tokens' K/V at req_to_token[req_pool_indices[b], prefix:seq_len].
    seq_lens counts prefix + new tokens. max_extend_len (a host int, >= every
    extend_seq_lens[b]) sizes the grid; requests with 0 new tokens are skipped. k_scale /
    v_scale: the pool's dequantization scales (1.0 for a pool in the model dtype).
    """
    num_tokens, q_heads, head_dim = q.shape
    bs = req_pool_indices.shape[0]
    if num_tokens == 0 or bs == 0 or max_extend_len == 0:
        return
    kv_heads = k_buffer.shape[1]
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_m = 64
    block_n = 64 if block_d <= 128 else 32
    grid = (triton.cdiv(max_extend_len, block_m), bs, q_heads)
    _extend_kernel[grid](
        q,
        o,
        k_buffer,
        v_buffer,
        req_to_token,
        req_pool_indices,
        seq_lens,
        extend_seq_lens,
        extend_start_loc,
        sm_scale * k_scale * LOG2E,
        v_scale,
        q.stride(0),
        q.stride(1),
        o.stride(0),
        o.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        req_to_token.stride(0),
        GROUP=q_heads // kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        IEEE=q.dtype == torch.float32,
        CAUSAL=causal,
        num_warps=4 if block_d <= 64 else 8,
        num_stages=2,
    )

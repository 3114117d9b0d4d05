"""Triton kernels that fuse the small per-layer ops of decode (CUDA only).

`qk_norm_rope_store`: from the fused qkv projection output, one launch per layer
  (a) RMS-normalises each q and k head when the model has q/k norms (Qwen3),
  (b) applies neox RoPE to q and k from the float32 cos/sin cache,
  (c) writes k and v straight into the KV pool at out_cache_loc,
  and returns q. Unfused, this is 2 RMSNorm + 1 RoPE + 2 index_put kernels plus copies.
`store_kv`: k and v into the pool in one launch (instead of two index_put kernels).
Both quantize for an FP8 pool (k / k_scale, v / v_scale, clamped; layers/kv_quant.py).
`rmsnorm`, `silu_and_mul`: RMSNorm (with the residual add fused in) and the gated activation,
either of them optionally writing its result quantized per token (RowQuant) for an FP8 GEMM.

Every kernel here can launch as a programmatic dependent (pdl=True, see kernels.pdl_enabled):
it is scheduled while the kernel before it drains, loads what no kernel of the step writes
(weights), then waits (gdc_wait) before touching anything else. At batch 1, where a decode
step is ~300 short kernels, that hides most of each launch-and-ramp gap.

Layout example (Qwen3-0.6B, one token): qkv row = [q0..q15 | k0..k7 | v0..v7], 128 each;
with one head per program, program (t, h) for h < 16 handles q head h; for 16 <= h < 24 it
handles k head h - 16 and copies v head h - 16. With 8 heads per program, program (t, 2)
handles heads 16..23, i.e. all of k0..k7 and v0..v7; Llama-3.1-8B's 40 heads (32 q, 8 k)
give 5 programs per token, and with 16 per program the third one (heads 32..47) masks off
heads 40..47.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs
    triton = None

from mini_sglang.layers.kernels import (
    SMALL_M_MAX_ROWS,
    gdc_launch_dependents,
    gdc_wait,
    kv_to_pool_units,
    pdl_enabled,
    silu_mul,
)
from mini_sglang.layers.kv_quant import fp8_max

# Heads per qk_norm_rope_store program above SMALL_M_MAX_ROWS tokens. One head per program
# made Llama-3.1-8B's batch-256 decode launch 10,240 programs of 128 values each, bound by
# how fast programs retire (each waits on positions, then cos/sin, then qkv). Blocks of 8
# heads, Llama-3.1-8B's layout on an H100 (benchmarks/bench_rope_store.py): 256 tokens 7.5
# -> 2.6 us, an 8192-token prefill chunk 209 -> 75 us per layer; 16 was no better. Up to
# SMALL_M_MAX_ROWS tokens (the PDL-chained small batches) one head per program stays: 1.57
# us at 1 token, 1.75 with 8.
ROPE_STORE_HEADS_PER_PROGRAM = 8


def small_batch_pdl_ops(x: torch.Tensor) -> bool:
    """Whether rmsnorm and silu_and_mul below take over from flashinfer's kernels for x: a
    2-D row-major batch of at most SMALL_M_MAX_ROWS rows (where the GEMVs around them are
    our PDL-launched Triton ones) on a GPU with PDL."""
    return x.dim() == 2 and x.shape[0] <= SMALL_M_MAX_ROWS and x.stride(1) == 1 and pdl_enabled(x)


def fused_ops_available(x: torch.Tensor, head_dim: int) -> bool:
    return triton is not None and x.is_cuda and head_dim in (64, 128, 256)


if triton is not None:

    @triton.jit
    def _qk_norm_rope_store_kernel(
        qkv,
        q_out,
        positions,
        cos_sin,
        q_w,
        k_w,
        loc,
        k_buf,
        v_buf,
        stride_qkv,
        stride_q,
        stride_kb,
        stride_vb,
        eps,
        inv_k_scale,
        inv_v_scale,
        NUM_Q: tl.constexpr,
        NUM_KV: tl.constexpr,
        D: tl.constexpr,
        HEADS: tl.constexpr,
        HAS_NORM: tl.constexpr,
        FP8_MAX: tl.constexpr,
        PDL: tl.constexpr,
    ):
        t = tl.program_id(0)
        if PDL:
            gdc_launch_dependents()
            gdc_wait()
        heads = tl.program_id(1) * HEADS + tl.arange(0, HEADS)[:, None]  # [HEADS, 1]
        exists = heads < NUM_Q + NUM_KV
        is_q = heads < NUM_Q
        is_k = exists & (heads >= NUM_Q)
        half = tl.arange(0, D // 2)[None, :]  # [1, D/2]
        pos = tl.load(positions + t)
        cos = tl.load(cos_sin + pos * D + half)
        sin = tl.load(cos_sin + pos * D + D // 2 + half)
        src = qkv + t * stride_qkv + heads * D + half  # q heads then k heads are contiguous
        x1 = tl.load(src, mask=exists, other=0.0).to(tl.float32)
        x2 = tl.load(src + D // 2, mask=exists, other=0.0).to(tl.float32)
        if HAS_NORM:
            r = 1.0 / tl.sqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1))[:, None] / D + eps)
            w1 = tl.where(is_q, tl.load(q_w + half), tl.load(k_w + half)).to(tl.float32)
            w2 = tl.where(is_q, tl.load(q_w + D // 2 + half), tl.load(k_w + D // 2 + half)).to(
                tl.float32
            )
            x1 = x1 * r * w1
            x2 = x2 * r * w2
        o1 = x1 * cos - x2 * sin
        o2 = x2 * cos + x1 * sin
        dst = q_out + t * stride_q + heads * D + half
        tl.store(dst, o1.to(q_out.dtype.element_ty), mask=is_q)
        tl.store(dst + D // 2, o2.to(q_out.dtype.element_ty), mask=is_q)
        # K/V rows: k head h - NUM_Q (offsets of q rows are negative here, and masked off).
        kv_head = heads - NUM_Q
        slot = tl.load(loc + t).to(tl.int64)
        kdst = k_buf + slot * stride_kb + kv_head * D + half
        k1 = kv_to_pool_units(o1, inv_k_scale, FP8_MAX)
        k2 = kv_to_pool_units(o2, inv_k_scale, FP8_MAX)
        tl.store(kdst, k1.to(k_buf.dtype.element_ty), mask=is_k)
        tl.store(kdst + D // 2, k2.to(k_buf.dtype.element_ty), mask=is_k)
        full = tl.arange(0, D)[None, :]
        vsrc = qkv + t * stride_qkv + (NUM_Q + NUM_KV) * D + kv_head * D + full
        v = kv_to_pool_units(tl.load(vsrc, mask=is_k), inv_v_scale, FP8_MAX)
        tl.store(
            v_buf + slot * stride_vb + kv_head * D + full, v.to(v_buf.dtype.element_ty), mask=is_k
        )

    @triton.jit
    def _store_kv_kernel(
        k,
        v,
        loc,
        k_buf,
        v_buf,
        stride_k,
        stride_v,
        stride_kb,
        stride_vb,
        inv_k_scale,
        inv_v_scale,
        ROW: tl.constexpr,
        BLOCK: tl.constexpr,
        FP8_MAX: tl.constexpr,
    ):
        t = tl.program_id(0)
        slot = tl.load(loc + t).to(tl.int64)
        for off in range(0, ROW, BLOCK):
            i = off + tl.arange(0, BLOCK)
            m = i < ROW
            kx = kv_to_pool_units(tl.load(k + t * stride_k + i, mask=m), inv_k_scale, FP8_MAX)
            vx = kv_to_pool_units(tl.load(v + t * stride_v + i, mask=m), inv_v_scale, FP8_MAX)
            tl.store(k_buf + slot * stride_kb + i, kx.to(k_buf.dtype.element_ty), mask=m)
            tl.store(v_buf + slot * stride_vb + i, vx.to(v_buf.dtype.element_ty), mask=m)

    @triton.jit
    def _rmsnorm_kernel(
        x,
        res,
        w,
        out,
        out_scale,
        stride_x,
        stride_r,
        stride_o,
        N,
        eps,
        BLOCK: tl.constexpr,
        HAS_RES: tl.constexpr,
        PDL: tl.constexpr,
        QUANT: tl.constexpr,
        QMAX: tl.constexpr,
        MIN_AMAX: tl.constexpr,
    ):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        mask = offs < N
        wv = tl.load(w + offs, mask=mask, other=0.0).to(tl.float32)  # never written in a step
        if PDL:
            gdc_launch_dependents()
            gdc_wait()
        h = tl.load(x + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_RES:
            h += tl.load(res + row * stride_r + offs, mask=mask, other=0.0).to(tl.float32)
            # round the sum to the model dtype first, as HF's residual stream is
            hb = h.to(res.dtype.element_ty)
            tl.store(res + row * stride_r + offs, hb, mask=mask)
            h = hb.to(tl.float32)
        r = 1.0 / tl.sqrt(tl.sum(h * h, 0) / N + eps)
        y = (h * r).to(x.dtype.element_ty).to(tl.float32) * wv
        if QUANT:
            y, scale = _quantize_row(y.to(x.dtype.element_ty), QMAX, MIN_AMAX)
            tl.store(out_scale + row, scale)
        tl.store(out + row * stride_o + offs, y.to(out.dtype.element_ty), mask=mask)

    @triton.jit
    def _silu_and_mul_kernel(
        x,
        out,
        out_scale,
        stride_x,
        stride_o,
        D,
        BLOCK: tl.constexpr,
        PDL: tl.constexpr,
        QUANT: tl.constexpr,
        QMAX: tl.constexpr,
        MIN_AMAX: tl.constexpr,
    ):
        # with QUANT one program holds the whole row (grid (M, 1)): its amax sets the scale
        row = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < D
        if PDL:
            gdc_launch_dependents()
            gdc_wait()
        g = tl.load(x + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(x + row * stride_x + D + offs, mask=mask, other=0.0)
        y = silu_mul(g, u)
        if QUANT:
            y, scale = _quantize_row(y, QMAX, MIN_AMAX)
            tl.store(out_scale + row, scale)
        tl.store(out + row * stride_o + offs, y.to(out.dtype.element_ty), mask=mask)

    @triton.jit
    def _quantize_row(y, QMAX: tl.constexpr, MIN_AMAX: tl.constexpr):
        """One row y (masked lanes 0, in the model dtype) -> (float32 y / scale clamped to
        +-QMAX, scale): the values fp8_kernels.per_token_quant gives for it."""
        y = y.to(tl.float32)
        scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(y), 0), MIN_AMAX), QMAX)
        return tl.minimum(tl.maximum(tl.math.div_rn(y, scale), -QMAX), QMAX), scale


@dataclass(frozen=True)
class RowQuant:
    """Where a kernel writes its result quantized per row instead (the values
    fp8_kernels.per_token_quant gives for that result, without its round trip through
    memory): values into `out` (FP8, or float32 holding FP8 values in Triton's
    interpreter), row scales into `scale` [M, 1] float32; `qmax` is the format's largest
    finite value, `min_amax` the smallest amax a scale is derived from."""

    out: torch.Tensor
    scale: torch.Tensor
    qmax: float
    min_amax: float


def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    pdl: bool = False,
    quant: RowQuant | None = None,
) -> torch.Tensor:
    """RMSNorm(x) * weight as HF computes it, for x [M, N] with unit column stride.

    With a residual it works in place, as flashinfer's fused_add_rmsnorm: residual += x, then
    x = RMSNorm(residual) * weight, and x is returned. Without one the result is a new tensor.
    With `quant` the result goes to quant.out (returned) and quant.scale, and x is not
    written (the residual still is).
    """
    m, n = x.shape
    out = quant.out if quant else x if residual is not None else torch.empty_like(x)
    if m:
        res = residual if residual is not None else x
        _rmsnorm_kernel[(m,)](
            x, res, weight, out, quant.scale if quant else weight, x.stride(0), res.stride(0),
            out.stride(0), n, eps, BLOCK=triton.next_power_of_2(n), HAS_RES=residual is not None,
            PDL=pdl, QUANT=quant is not None, QMAX=quant.qmax if quant else 1.0,
            MIN_AMAX=quant.min_amax if quant else 0.0, num_warps=8, launch_pdl=pdl,
        )  # fmt: skip
    return out


def silu_and_mul(x: torch.Tensor, pdl: bool = False, quant: RowQuant | None = None) -> torch.Tensor:
    """silu(x[:, :d]) * x[:, d:] for x [M, 2d], rounding silu to x's dtype before the product
    as flashinfer and HF do. With `quant` the result goes to quant.out (returned) and
    quant.scale: one program then holds a whole row, whose amax sets its scale."""
    m, d = x.shape[0], x.shape[1] // 2
    out = quant.out if quant else torch.empty((m, d), dtype=x.dtype, device=x.device)
    if m:
        block = triton.next_power_of_2(d) if quant else 1024
        _silu_and_mul_kernel[(m, triton.cdiv(d, block))](
            x, out, quant.scale if quant else out, x.stride(0), out.stride(0), d, BLOCK=block,
            PDL=pdl, QUANT=quant is not None, QMAX=quant.qmax if quant else 1.0,
            MIN_AMAX=quant.min_amax if quant else 0.0,
            num_warps=min(16, max(4, block // 1024)), launch_pdl=pdl,
        )  # fmt: skip
    return out


def qk_norm_rope_store(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    eps: float,
    out_cache_loc: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    pdl: bool = False,
    heads_per_program: int | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Returns q [T, num_q_heads * head_dim]; K/V of the T tokens land in the pool
    (quantized with k_scale / v_scale when the pool is FP8; ignored otherwise).

    Each program handles `heads_per_program` heads (a power of two) of one token; by
    default 1 for batches of up to SMALL_M_MAX_ROWS tokens, ROPE_STORE_HEADS_PER_PROGRAM
    above that (see there)."""
    t = qkv.shape[0]
    q = torch.empty((t, num_q_heads * head_dim), dtype=qkv.dtype, device=qkv.device)
    if t == 0:
        return q
    has_norm = q_norm_weight is not None
    dummy = q if not has_norm else None
    heads = heads_per_program or (1 if t <= SMALL_M_MAX_ROWS else ROPE_STORE_HEADS_PER_PROGRAM)
    _qk_norm_rope_store_kernel[(t, triton.cdiv(num_q_heads + num_kv_heads, heads))](
        qkv,
        q,
        positions,
        cos_sin_cache,
        q_norm_weight if has_norm else dummy,
        k_norm_weight if has_norm else dummy,
        out_cache_loc,
        k_buf,
        v_buf,
        qkv.stride(0),
        q.stride(0),
        k_buf.stride(0),
        v_buf.stride(0),
        eps,
        1.0 / k_scale,
        1.0 / v_scale,
        NUM_Q=num_q_heads,
        NUM_KV=num_kv_heads,
        D=head_dim,
        HEADS=heads,
        HAS_NORM=has_norm,
        FP8_MAX=fp8_max(k_buf.dtype),
        PDL=pdl,
        launch_pdl=pdl,
    )
    return q


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    loc: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """k_buf[loc] = k and v_buf[loc] = v for k, v of shape [T, heads, head_dim]; into an FP8
    pool k / k_scale and v / v_scale, clamped to its range (kv_quant.quantize_kv). k, v are
    in the pool's dtype unless the pool is FP8."""
    t = k.shape[0]
    if t == 0:
        return
    k2, v2 = k.reshape(t, -1), v.reshape(t, -1)
    row = k2.shape[1]
    _store_kv_kernel[(t,)](
        k2,
        v2,
        loc,
        k_buf,
        v_buf,
        k2.stride(0),
        v2.stride(0),
        k_buf.stride(0),
        v_buf.stride(0),
        1.0 / k_scale,
        1.0 / v_scale,
        ROW=row,
        BLOCK=min(1024, triton.next_power_of_2(row)),
        FP8_MAX=fp8_max(k_buf.dtype),
    )

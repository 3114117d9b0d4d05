"""Linear layers for small batches (decode at batch 1..8) on CUDA.

At batch 1 a linear layer is a memory-bound GEMV; cuBLAS does not always pick a kernel that
streams the weight at full bandwidth for these skinny shapes. `linear` times cuBLAS against
a simple Triton GEMV once per (power-of-two bucket of M, N, K, dtype) — outside CUDA-graph
capture, during the warm-up runs that precede it — and then always uses the faster one. The
timing replays a CUDA graph with the weight cold in L2 (see cuda_time_ms), the conditions of
a decode step; timed hot, a weight that fits in L2 rewards the wrong kernel. Larger M, CPU
and float32 go straight to F.linear. At one row the candidates include a persistent kernel
(_gemv_rows_kernel: a few programs per SM, x loaded once, row blocks streamed). For FP8
weights both kernels have an integer e4m3 decoding (PERSISTENT_BITS configs).

The GEMV also takes work from the kernels around it: the gated MLP's SiLU-and-multiply in
its epilogue (linear_silu_mul), an RMSNorm of x in its prologue (linear_rmsnorm) and a
residual add in its epilogue (linear_add_). A prologue or epilogue can change which config
is fastest, so the norm and residual variants are timed as themselves.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable

import torch
import torch.nn.functional as F

from mini_sglang.environ import envs
from mini_sglang.layers import kernel_choices
from mini_sglang.layers.e4m3_decode import e4m3_words
from mini_sglang.layers.kernels import (
    SMALL_M_MAX_ROWS,
    gdc_launch_dependents,
    gdc_wait,
    pdl_enabled,
    silu_mul,
)
from mini_sglang.utils.cuda_timing import cuda_time_ms

try:
    import triton
    import triton.language as tl

    from mini_sglang.layers.e4m3_decode import X_SCALE, bf16_quads, e4m3_dot_terms
except ImportError:
    triton = None

logger = logging.getLogger(__name__)

MAX_M = SMALL_M_MAX_ROWS
_ENABLED = not envs.MINI_SGLANG_DISABLE_SMALL_M_GEMM.get()
_FUSE_SILU_MUL = not envs.MINI_SGLANG_DISABLE_GEMV_SILU_FUSION.get()
FUSE_NORM = not envs.MINI_SGLANG_DISABLE_GEMV_NORM_FUSION.get()
_FOLD_MLP_NORM = not envs.MINI_SGLANG_DISABLE_GEMV_MLP_NORM_FOLD.get()
_CHANNEL_DENSE = not envs.MINI_SGLANG_DISABLE_FP8_CHANNEL_DENSE.get()
# (M bucket, N, K, dtype, fused variant) -> None (cuBLAS) or the Triton config (BLOCK_N,
# BLOCK_K, num_warps[, num_stages])
_choice: dict[tuple, tuple | None] = {}
# Candidates, (BLOCK_N, BLOCK_K, num_warps[, num_stages]). The 4-tuples won Llama-3.1-8B's
# shapes at M=1 on an H100 in bench_linear's sweeps (narrow row blocks, so many CTAs; long K
# tiles); the rest serve M up to 8 and small K. (8, 2048, 4, 2) moves the bytes of
# (4, 2048, 4, 2) per tile with FP8 weights: on an H200 (sweep_gemv_configs.py --fp8) it ran
# Llama-3.1-8B's FP8 gate_up in 38.2 us against 53.7 for the best of the others, and its
# qkv in 13.5 against 14.5 us.
_CONFIGS = [
    (2, 2048, 8, 3),
    (4, 2048, 4, 2),
    (8, 2048, 4, 2),
    (2, 4096, 8, 1),
    (2, 1024, 4, 2),
    (4, 1024, 4, 2),
    (16, 256, 4),
    (32, 128, 4),
    (8, 512, 4),
    (64, 64, 4),
]
# FP8 weights only: 5-tuples whose last element 1 selects tensor-core dots (DOT below: the
# FP8 tile converted to x's dtype, x padded to 16 rows, tl.dot with fp32 accumulation)
# instead of converting every weight to fp32 for a multiply and a sum. At batch 1 an FP8
# GEMV converts and multiplies twice the elements per byte a bf16 one does, and it read
# Llama-3.1-8B's qkv and o at 1.9 TB/s against gate_up's 3.1 (docs/performance/
# decode-gemv.md). The start-up pick times these beside _CONFIGS, so they serve only where
# they are faster (and a config the compiler rejects is skipped).
_FP8_DOT_CONFIGS = [
    (16, 512, 4, 3, 1),
    (16, 1024, 4, 2, 1),
    (32, 256, 4, 3, 1),
    (32, 512, 8, 2, 1),
]


# One row of x only (M = 1): 6-tuples (BLOCK_N, 0, num_warps, num_stages, PERSISTENT,
# programs per SM) select _gemv_rows_kernel, a grid of a few programs per SM that each load
# the whole of x once and then stream row blocks, the next block's load in flight while the
# current one is summed (BLOCK_K 0: a row block spans all of K). The grid kernel above loads
# x again with every weight tile, and for an FP8 weight at BLOCK_N 4-8 that is as many bytes
# from L2 as the tile reads from HBM; its programs also each pay their own launch and ramp.
# PERSISTENT_BITS (FP8 weights only) decodes e4m3 with integer ops instead of Triton's
# conversion (see layers/e4m3_decode.py), which held every FP8 GEMV to about 12 weights per SM and
# cycle on an H200 whatever the tiling, where bf16 rows streamed faster per byte.
PERSISTENT, PERSISTENT_BITS = 2, 3
# The configs that came first to third for one of Llama-3.1-8B's shapes at M=1 on an H200
# (sweep_gemv_configs.py --candidates-only; docs/performance/decode-gemv.md): each candidate
# is a compile at a fresh start-up, so the rest of the swept ones were left out. FP8
# weights take only the integer-decoding ones, which beat the fp32-converting ones there;
# (2, 0, 4, 1, 3, 5) is the 6-per-SM one capped at the 5 programs an SM holds when gate_up
# folds the post-attention norm (92 registers a thread on sm90, rmsnorm_silu_mul_fold).
_ROW_CONFIGS = [
    (2, 0, 8, 1, PERSISTENT, 4),
    (2, 0, 4, 1, PERSISTENT, 4),
    (1, 0, 8, 1, PERSISTENT, 4),
]
_FP8_ROW_CONFIGS = [
    (8, 0, 8, 1, PERSISTENT_BITS, 2),
    (4, 0, 4, 1, PERSISTENT_BITS, 4),
    (2, 0, 4, 1, PERSISTENT_BITS, 6),
    (2, 0, 4, 1, PERSISTENT_BITS, 5),
    (2, 0, 8, 1, PERSISTENT_BITS, 4),
]


# Block-scaled FP8 weights: _FP8_ROW_CONFIGS and two that launch only the programs an SM
# holds for o_proj-like rows (K 4096): the scales (a [BK] vector a program, double-buffered)
# take it to 79 registers a thread at (2, 0, 8, 1, 3, 4) and 125 at (2, 0, 4, 1, 3, 5 | 6),
# 3 and 4 programs an SM (kernel_resources.py --gemv, Triton 3.6, sm90), so those launches
# ran a second wave of programs after the first.
_FP8_BLOCK_ROW_CONFIGS = _FP8_ROW_CONFIGS + [
    (2, 0, 8, 1, PERSISTENT_BITS, 3),
    (2, 0, 4, 1, PERSISTENT_BITS, 4),
]


# FP8 weights only: grid configs (BLOCK_N, BLOCK_K, warps, stages, PERSISTENT_BITS) whose
# kernel decodes e4m3 with integer ops too (BLOCK_K counts weights; the tiles hold a
# quarter as many int32 words). For down (4096 x 14336) no persistent config fits its
# registers (decode-gemv.md), and the fp32 conversion held the grid kernel near 12 weights
# per SM and cycle.
_FP8_GRID_BITS_CONFIGS = [
    (4, 2048, 4, 2, PERSISTENT_BITS),
    (8, 2048, 4, 2, PERSISTENT_BITS),
]


# FP8 weights with per-row scales, several rows of x: (BLOCK_N, BLOCK_K, warps, 0, DENSE_DOWN)
# runs fused_moe_gemv.channel_fp8_gemv at those tiles, the expert down kernel with one
# expert (the kernel block-wise FP8 layers run at 2-4 rows): one program per row block and
# row of x, the weight read as int32 words, the scale and a residual add in its epilogue.
# No norm or SiLU-mul prologue: forced for a shape, it runs the plain and residual variants,
# and the others unfused (forced_choice).
DENSE_DOWN = 4


# Per-channel FP8 weights of at most CHANNEL_FP8_DENSE_MAX_BYTES at 3-4 rows of x (the
# 4-row bucket) run this DENSE_DOWN config, not the timed pick, except where the GEMV folds a
# SiLU-mul (linear_silu_mul keeps its pick) or a config is forced for the shape
# (channel_fp8_dense_choice). Timed alone the two are level (bench_linear.py: o_proj 11.5
# against 11.6 us at 4 rows), but inside the decode step the picks, tensor-core dot configs
# there, ran Qwen3-30B-A3B's o_proj in 26 us where alone it took 11: on an H100, Qwen3-30B-A3B
# (12 layers) took 1.480 ms a step at batch 4 with the rule against 1.688 without, 1.500
# against 1.700 at batch 3. Llama-3.1-8B's larger weights (qkv 24 MiB, o_proj 16, down 56)
# went the other way, 9.51 ms a step at batch 4 with the rule against 5.93 without. The
# kernel runs a program per row block and row of x, so it reads each weight tile once per
# row; the likely reason (not profiled) is that only a weight that stays in L2 (50 MiB on
# the H100) serves those rereads, and Qwen3's projections are 8 and 10 MiB. The bound lies
# between the shapes measured (docs/performance/decode-gemv.md). At 2 rows it was level on
# Qwen3 and 11% slower on Llama, so that bucket keeps its picks.
CHANNEL_FP8_DENSE = (16, 512, 8, 0, DENSE_DOWN)
CHANNEL_FP8_DENSE_BUCKET = 4
CHANNEL_FP8_DENSE_MAX_BYTES = 12 << 20


def channel_fp8_dense_choice(
    w: torch.Tensor, variant: tuple[str, ...], bucket: int
) -> tuple | None:
    """The choice CHANNEL_FP8_DENSE makes for a per-channel FP8 `variant` at M's bucket
    (forced_choice's: the config, or None to run a norm prologue unfused), or () where the
    timed pick stands: other buckets and formats, weights over CHANNEL_FP8_DENSE_MAX_BYTES,
    a shape with a forced config, and MINI_SGLANG_DISABLE_FP8_CHANNEL_DENSE=1."""
    if (
        bucket != CHANNEL_FP8_DENSE_BUCKET
        or "fp8" not in variant  # per-row scales only: block scales are "fp8block..."
        or w.numel() * w.element_size() > CHANNEL_FP8_DENSE_MAX_BYTES
        or tuple(w.shape) in _FORCED
        or not _CHANNEL_DENSE
    ):
        return ()
    return forced_choice(CHANNEL_FP8_DENSE, w, variant, bucket)


def is_dense_down(cfg: tuple | None) -> bool:
    """Whether a GEMV config selects fused_moe_gemv.channel_fp8_gemv (DENSE_DOWN)."""
    return cfg is not None and len(cfg) == 5 and cfg[4] == DENSE_DOWN


def is_persistent(cfg: tuple | None) -> bool:
    """Whether a GEMV config selects _gemv_rows_kernel (one row of x only); None (cuBLAS,
    e.g. forced with MINI_SGLANG_GEMV_CONFIGS=NxK:cublas) does not."""
    return cfg is not None and len(cfg) > 5 and cfg[4] in (PERSISTENT, PERSISTENT_BITS)


def block_of(variant: tuple[str, ...]) -> tuple[int, int] | None:
    """The weight block (rows, columns) of a variant naming block-wise FP8 scales
    ("fp8block128x128"), else None."""
    for v in variant:
        if v.startswith("fp8block"):
            rows, cols = v.removeprefix("fp8block").split("x")
            return int(rows), int(cols)
    return None


def candidates(variant: tuple[str, ...] = (), rows: int = 1) -> list[tuple]:
    """The Triton configs the pick times for a fused variant and x of `rows` rows: _CONFIGS,
    the persistent one-row configs where rows == 1 (_FP8_ROW_CONFIGS for an FP8 weight,
    else _ROW_CONFIGS), and the tensor-core dot configs for an FP8 weight (with SiLU-mul
    only those whose half of BLOCK_N, a program's gate rows, is still tl.dot's smallest N,
    16). Block-wise FP8 scales: the persistent integer-decoding configs at one row only
    (_FP8_BLOCK_ROW_CONFIGS)."""
    if block_of(variant) is not None:
        return list(_FP8_BLOCK_ROW_CONFIGS) if rows == 1 else []
    if "fp8" not in variant:
        return _CONFIGS + (_ROW_CONFIGS if rows == 1 else [])
    dots = [c for c in _FP8_DOT_CONFIGS if "silu_mul" not in variant or c[0] >= 32]
    return _CONFIGS + (_FP8_ROW_CONFIGS if rows == 1 else []) + _FP8_GRID_BITS_CONFIGS + dots


# a Triton config must beat cuBLAS by this factor: graph timings repeat within ~1%
_MARGIN = 0.97
# ... plus this much (ms) where the Triton GEMV launches as a programmatic dependent (PDL): in
# a decode step it then starts streaming its weight while the kernel before it drains, which
# its standalone timing does not see. The credit is a time, not a factor: it is a launch and
# ramp hidden per call. As a factor (1.10) it let 30-60 us Triton GEMVs within 10% of cuBLAS
# win on an H200, where inside the step cuBLAS ran Llama-3.1-8B's gate_up and down faster
# (batch 1: 4.81 ms/token vs 4.64 with cuBLAS there), while the 2-5 us GEMVs of Qwen3-0.6B
# need the credit (0.90 vs 0.81 without it). MINI_SGLANG_GEMV_PDL_CREDIT_US overrides it.
_PDL_CREDIT_MS = envs.MINI_SGLANG_GEMV_PDL_CREDIT_US.get() / 1000


def _parse_forced(spec: str) -> dict[tuple[int, int], tuple | None]:
    """MINI_SGLANG_GEMV_CONFIGS, for experiments: ';'- or '/'-separated "NxK:config" entries
    that replace the timed pick for every weight of that shape, e.g.
    "4096x4096:4,2048,4,2;28672x4096:cublas" runs Llama-3.1-8B's o_proj with BLOCK_N 4,
    BLOCK_K 2048, 4 warps, 2 stages and its gate_up_proj on cuBLAS ('/' where ';' is taken,
    as in run_gpu_suite.sh's AB_ARMS)."""
    forced: dict[tuple[int, int], tuple | None] = {}
    for entry in filter(None, re.split("[;/]", spec)):
        shape, cfg = entry.split(":")
        n, k = (int(v) for v in shape.split("x"))
        forced[(n, k)] = None if cfg == "cublas" else tuple(int(v) for v in cfg.split(","))
    return forced


_FORCED = _parse_forced(envs.MINI_SGLANG_GEMV_CONFIGS.get())


if triton is not None:

    @triton.jit
    def _tile_product(xt, wt, x, DOT: tl.constexpr, IEEE: tl.constexpr):
        """xt [BM, BK] (fp32) @ wt [BN, BK]^T -> [BM, BN] fp32: with DOT one tl.dot with both
        tiles in x's dtype (x: the input pointer; IEEE for float32 x: exact products, not
        TF32), else an elementwise fp32 multiply and sum."""
        # DOT and IEEE are constexpr: Triton compiles only the branches taken.
        if DOT:
            a = xt.to(x.dtype.element_ty)
            b = tl.trans(wt.to(x.dtype.element_ty))
            prod = tl.dot(a, b, input_precision="ieee") if IEEE else tl.dot(a, b)
        else:
            prod = tl.sum(xt[:, None, :] * wt.to(tl.float32)[None, :, :], axis=2)
        return prod

    @triton.jit
    def _epilogue(
        acc,
        acc_up,
        out_ptrs,
        out_mask,
        w_scale,
        rn,
        N,
        rstd,
        SILU_MUL: tl.constexpr,
        ADD_RES: tl.constexpr,
        NORM: tl.constexpr,
        W_SCALE: tl.constexpr,
    ):
        """The GEMV's result for the dot products acc (and acc_up, the up rows', with
        SILU_MUL) of output columns rn, in out's dtype, ready for the store to out_ptrs:
        each column's w_scale (FP8), the norm's rstd, SiLU-mul, and with ADD_RES the
        residual read from out_ptrs added. acc [BN] or [BM, BN]; rstd broadcasts to it."""
        out_ty = out_ptrs.dtype.element_ty
        if W_SCALE:  # a per-row scale of a quantized w (FP8): out = x @ (w * scale)^T
            acc = acc * tl.load(w_scale + rn, mask=rn < N, other=0.0)
            if SILU_MUL:
                acc_up = acc_up * tl.load(w_scale + N + rn, mask=rn < N, other=0.0)
        if NORM:
            acc = acc * rstd
            if SILU_MUL:
                acc_up = acc_up * rstd
        y = acc.to(out_ty)
        if SILU_MUL:
            # rounded as gemv's output and then fused_kernels.silu_and_mul would round
            y = silu_mul(y.to(tl.float32), acc_up.to(out_ty))
        if ADD_RES:
            # out holds the residual: y + residual, rounded as the add of fused_kernels.rmsnorm
            # rounds; a program reads and writes only its own columns
            r = tl.load(out_ptrs, mask=out_mask, other=0.0)
            y = (y.to(tl.float32) + r.to(tl.float32)).to(out_ty)
        return y

    @triton.jit
    def _gemv_kernel(  # noqa: C901  # its branches are constexpr specialisations, compiled away
        x,
        w,
        out,
        M,
        N,
        K,
        sxm,
        swn,
        som,
        norm_w,
        eps,
        w_scale,
        BM: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
        PDL: tl.constexpr,
        SILU_MUL: tl.constexpr,
        ADD_RES: tl.constexpr,
        NORM: tl.constexpr,
        NORM_G: tl.constexpr,
        W_SCALE: tl.constexpr,
        DOT: tl.constexpr,
        IEEE: tl.constexpr,
        BITS: tl.constexpr,
        X_WORDS: tl.constexpr,
    ):
        # With DOT each K tile is one tl.dot of x [BM >= 16, BK] and the weight tile
        # transposed [BK, BN >= 16], both in x's dtype (fp32 accumulation; IEEE: exact fp32
        # products for float32 x, not TF32); without, an elementwise fp32 multiply and sum.
        # With BITS w holds int32 words of four e4m3 weights, decoded with integer ops as in
        # _gemv_rows_kernel; BK then counts words (4 * BK weights a tile) and swn words too.
        # X_WORDS (BITS, one bf16 row of x, x and g 8-byte aligned): x and g read as int64
        # words of four (bf16_quads).
        # A program computes BN outputs out[:, rn]: x @ w[rn]^T, or with SILU_MUL, where w is
        # [gate; up] (2N rows), silu(x @ w[rn]^T) * (x @ w[N + rn]^T); e.g. N = 14336, BN = 2:
        # program 3 reads gate rows 6, 7 and up rows 14342, 14343, and writes columns 6, 7.
        pid = tl.program_id(0)
        rn = pid * BN + tl.arange(0, BN)
        rm = tl.arange(0, BM)
        rk = tl.arange(0, BK)
        kw = K // 4 if BITS else K  # a weight row's length in loaded elements
        w_rows = w + rn[:, None] * swn
        w_mask = rn[:, None] < N
        # The weight is never written during a step, so its first tile is loaded before the
        # wait: under programmatic dependent launch (PDL) this kernel starts while the one
        # producing x drains, and only the x loads wait (gdc_wait) for that kernel's writes.
        wt = tl.load(w_rows + rk[None, :], mask=w_mask & (rk[None, :] < kw), other=0.0)
        wu = wt  # unread without SILU_MUL
        if SILU_MUL:
            wu = tl.load(
                w_rows + N * swn + rk[None, :], mask=w_mask & (rk[None, :] < kw), other=0.0
            )
        if PDL:
            gdc_launch_dependents()
            gdc_wait()
        x_rows = x + rm[:, None] * sxm
        x_mask = rm[:, None] < M
        acc, acc_up, sq = _k_tile(x, x_rows, x_mask, norm_w, rk, K, wt, wu,
                                  SILU_MUL, NORM_G, DOT, IEEE, BITS, X_WORDS)  # fmt: skip
        for k0 in range(BK, kw, BK):
            rk = k0 + tl.arange(0, BK)
            k_mask = rk[None, :] < kw
            wt = tl.load(w_rows + rk[None, :], mask=w_mask & k_mask, other=0.0)
            if SILU_MUL:
                wu = tl.load(w_rows + N * swn + rk[None, :], mask=w_mask & k_mask, other=0.0)
            a, a_up, s = _k_tile(x, x_rows, x_mask, norm_w, rk, K, wt, wu,
                                 SILU_MUL, NORM_G, DOT, IEEE, BITS, X_WORDS)  # fmt: skip
            acc += a
            acc_up += a_up
            sq += s
        if BITS and BM == 1:  # the per-element terms, summed once here (see _k_tile)
            acc = (tl.sum(acc, axis=1) * X_SCALE)[None, :]
            acc_up = (tl.sum(acc_up, axis=1) * X_SCALE)[None, :]
        elif BITS:
            acc = tl.sum(acc, axis=2) * X_SCALE
            acc_up = tl.sum(acc_up, axis=2) * X_SCALE
        rstd = 1.0
        if NORM:
            rstd = (1.0 / tl.sqrt(tl.sum(sq, axis=1) / K + eps))[:, None]
        out_ptrs = out + rm[:, None] * som + rn[None, :]
        out_mask = (rm[:, None] < M) & (rn[None, :] < N)
        y = _epilogue(acc, acc_up, out_ptrs, out_mask, w_scale, rn, N, rstd,
                      SILU_MUL, ADD_RES, NORM, W_SCALE)  # fmt: skip
        tl.store(out_ptrs, y, mask=out_mask)

    @triton.jit
    def _row_dots(wt, x0, x1, x2, x3, sc, BITS: tl.constexpr, W_BLOCK: tl.constexpr):
        """sum_k w[n, k] x[k] per row n of the tile wt: with BITS wt holds int32 words of
        four e4m3 weights (see e4m3_dot_terms) and x_i the x of element 4j + i (times
        2^60); else wt [BN, BK] in any float type and x0 [BK]. With W_BLOCK each loaded
        column's term is multiplied by sc [BK], the scale of the weight block it lies in."""
        if BITS:
            prod = e4m3_dot_terms(wt, x0[None, :], x1[None, :], x2[None, :], x3[None, :])
        else:
            prod = x0[None, :] * wt.to(tl.float32)
        if W_BLOCK:
            prod = prod * sc[None, :]
        if BITS:
            return tl.sum(prod, axis=1) * X_SCALE
        return tl.sum(prod, axis=1)

    @triton.jit
    def _block_scales(w_scale, row, N, ssn, sk, k_mask, SB_N: tl.constexpr):
        """The scales [BK] of the loaded columns of the row block that starts at `row`,
        whose rows lie in one block of SB_N rows: w_scale[row // SB_N, sk] (sk: each
        column's block of columns), 0 past K or where row >= N (a next block past the end)."""
        mask = k_mask & (sk * 0 + row < N)  # row broadcast: the interpreter refuses 0-d masks
        return tl.load(w_scale + (row // SB_N) * ssn + sk, mask=mask, other=0.0)

    @triton.jit
    def _x_tile(x_rows, x_mask, norm_w, rk, K, NORM_G: tl.constexpr, BITS: tl.constexpr):
        """x[:, rk] [BM, BK] in float32, and x[:, rk] * g[rk] with NORM_G (times 2^60 with
        BITS): _x_part for the rows of the grid kernel."""
        xt = tl.load(x_rows + rk[None, :], mask=x_mask & (rk[None, :] < K), other=0.0)
        xt = xt.to(tl.float32)
        xs = xt
        if NORM_G:
            xs = xs * tl.load(norm_w + rk, mask=rk < K, other=0.0).to(tl.float32)[None, :]
        if BITS:
            xs = xs * X_SCALE
        return xt, xs

    @triton.jit
    def _k_tile(
        x, x_rows, x_mask, norm_w, rk, K, wt, wu,
        SILU_MUL: tl.constexpr, NORM_G: tl.constexpr, DOT: tl.constexpr, IEEE: tl.constexpr,
        BITS: tl.constexpr, X_WORDS: tl.constexpr,
    ):  # fmt: skip
        """One K tile of the grid kernel: (x @ wt^T, x @ wu^T with SILU_MUL, else the first
        again, x^2) for the rows of x at columns rk, or with BITS at the words rk (weights
        4 * rk + i; both products then times 2^-60, see e4m3_word_byte). With BITS and
        one row (x_mask [1, 1]) the products are the per-element terms [BN, BK], which the
        caller sums once after its K loop: no reduction across the warps per tile."""
        if BITS and x_mask.shape[0] == 1:  # one row: x's parts as vectors, tiles [BN, BK]
            if X_WORDS:
                xt, x1t, x2t, x3t = bf16_quads(x, rk, K)
                x0, x1, x2, x3 = xt, x1t, x2t, x3t
                if NORM_G:
                    g0, g1, g2, g3 = bf16_quads(norm_w, rk, K)
                    x0, x1, x2, x3 = x0 * g0, x1 * g1, x2 * g2, x3 * g3
                x0, x1, x2, x3 = x0 * X_SCALE, x1 * X_SCALE, x2 * X_SCALE, x3 * X_SCALE
                sq = xt * xt + x1t * x1t + x2t * x2t + x3t * x3t
            else:
                x0, x1, x2, x3, sq = _x_quads(x, norm_w, rk, K, NORM_G)
            sq = sq[None, :]
            x0, x1, x2, x3 = x0[None, :], x1[None, :], x2[None, :], x3[None, :]
            acc = e4m3_dot_terms(wt, x0, x1, x2, x3)
            acc_up = acc
            if SILU_MUL:
                acc_up = e4m3_dot_terms(wu, x0, x1, x2, x3)
        elif BITS:  # [BM, BN, BK]
            xt, x0 = _x_tile(x_rows, x_mask, norm_w, 4 * rk, K, NORM_G, BITS)
            x1t, x1 = _x_tile(x_rows, x_mask, norm_w, 4 * rk + 1, K, NORM_G, BITS)
            x2t, x2 = _x_tile(x_rows, x_mask, norm_w, 4 * rk + 2, K, NORM_G, BITS)
            x3t, x3 = _x_tile(x_rows, x_mask, norm_w, 4 * rk + 3, K, NORM_G, BITS)
            sq = xt * xt + x1t * x1t + x2t * x2t + x3t * x3t
            x0, x1, x2, x3 = x0[:, None, :], x1[:, None, :], x2[:, None, :], x3[:, None, :]
            acc = e4m3_dot_terms(wt[None, :, :], x0, x1, x2, x3)
            acc_up = acc
            if SILU_MUL:
                acc_up = e4m3_dot_terms(wu[None, :, :], x0, x1, x2, x3)
        else:
            xt, xs = _x_tile(x_rows, x_mask, norm_w, rk, K, NORM_G, BITS)
            sq = xt * xt
            acc = _tile_product(xs, wt, x, DOT, IEEE)
            acc_up = acc
            if SILU_MUL:
                acc_up = _tile_product(xs, wu, x, DOT, IEEE)
        return acc, acc_up, sq

    @triton.jit
    def _x_part(x, norm_w, rk, K, NORM_G: tl.constexpr, BITS: tl.constexpr):
        """x[rk] in float32, and x[rk] * g[rk] with NORM_G (times 2^60 with BITS)."""
        xt = tl.load(x + rk, mask=rk < K, other=0.0).to(tl.float32)
        xs = xt
        if NORM_G:
            xs = xs * tl.load(norm_w + rk, mask=rk < K, other=0.0).to(tl.float32)
        if BITS:
            xs = xs * X_SCALE
        return xt, xs

    @triton.jit
    def _x_quads(x, norm_w, rj, K, NORM_G: tl.constexpr):
        """For the int32 words rj of an e4m3 weight row: x_i = x[4j + i] (times g[4j + i]
        with NORM_G, and 2^60) for i = 0..3, and the sum of the four x[4j + i]^2."""
        xt, x0 = _x_part(x, norm_w, 4 * rj, K, NORM_G, True)
        x1t, x1 = _x_part(x, norm_w, 4 * rj + 1, K, NORM_G, True)
        x2t, x2 = _x_part(x, norm_w, 4 * rj + 2, K, NORM_G, True)
        x3t, x3 = _x_part(x, norm_w, 4 * rj + 3, K, NORM_G, True)
        return x0, x1, x2, x3, xt * xt + x1t * x1t + x2t * x2t + x3t * x3t

    @triton.jit
    def _gemv_rows_kernel(  # noqa: C901  # constexpr specialisations, as _gemv_kernel's
        x,
        w,
        out,
        N,
        K,
        swn,
        norm_w,
        eps,
        w_scale,
        ssn,
        BN: tl.constexpr,
        BK: tl.constexpr,
        PDL: tl.constexpr,
        SILU_MUL: tl.constexpr,
        ADD_RES: tl.constexpr,
        NORM: tl.constexpr,
        NORM_G: tl.constexpr,
        W_SCALE: tl.constexpr,
        BITS: tl.constexpr,
        W_BLOCK: tl.constexpr,
        SB_N: tl.constexpr,
        SB_K: tl.constexpr,
    ):
        # out[0, :N] = x[0] @ w^T, with _gemv_kernel's options, M = 1 and whole rows a tile
        # (BK >= the row's length in w's elements: K, or K / 4 int32 words with BITS).
        # Program p of P computes row blocks p, p + P, p + 2P, ... (block b: rows
        # b * BN .. b * BN + BN - 1; with SILU_MUL gate rows b * BN.. and up rows N + b * BN..,
        # as _gemv_kernel). x, its norm and g are loaded once; block b + P's weight is
        # loaded before block b is summed, so a program always has a load in flight.
        # E.g. o_proj, N 4096, BN 4, P 528: program 5 computes rows 20-23 and 2132-2135.
        # W_BLOCK: w_scale [rows / SB_N, columns / SB_K] (row stride ssn) holds one scale per
        # block of w (SB_K counts loaded elements: int32 words with BITS); a row block lies
        # in one block of rows (SB_N % BN == 0), so its scales are one per loaded column,
        # loaded with its weight. E.g. 128 x 128 blocks, BITS (SB_K 32 words), BN 4: rows
        # 260-263 take w_scale[2, j // 32] for word j.
        pid = tl.program_id(0)
        step = tl.num_programs(0)
        rb = tl.arange(0, BN)
        rj = tl.arange(0, BK)
        in_k = rj < (K // 4 if BITS else K)
        k_mask = in_k[None, :]
        up = N * swn if SILU_MUL else 0
        rn = pid * BN + rb
        ptrs = w + rn[:, None] * swn + rj[None, :]
        wt = tl.load(ptrs, mask=(rn[:, None] < N) & k_mask, other=0.0)
        if SILU_MUL:
            wu = tl.load(ptrs + up, mask=(rn[:, None] < N) & k_mask, other=0.0)
        sk = rj // SB_K  # unread without W_BLOCK
        sc = rj.to(tl.float32)  # unread without W_BLOCK
        scu = sc
        if W_BLOCK:  # the scales, as the weight, are never written during a step
            sc = _block_scales(w_scale, pid * BN, N, ssn, sk, in_k, SB_N)
            if SILU_MUL:
                scu = _block_scales(w_scale, N + pid * BN, 2 * N, ssn, sk, in_k, SB_N)
        if PDL:  # as in _gemv_kernel: only x waits for the kernel that writes it
            gdc_wait()
        nblocks = tl.cdiv(N, BN)
        if BITS:  # x of element 4j + i, for byte i of word j
            x0, x1, x2, x3, sq = _x_quads(x, norm_w, rj, K, NORM_G)
        else:
            xt, x0 = _x_part(x, norm_w, rj, K, NORM_G, BITS)
            x1, x2, x3 = x0, x0, x0  # unread without BITS
            sq = xt * xt
        rstd = 1.0
        if NORM:  # RMSNorm's 1 / rms, once per program: x is the same for every block
            rstd = 1.0 / tl.sqrt(tl.sum(sq, axis=0) / K + eps)
        for b in range(pid, nblocks, step):
            if PDL:  # noqa: SIM102  # PDL is a constexpr, b a tensor: kept apart for Triton
                # The dependent kernel launches once every program has got here, its last
                # block. _gemv_kernel signals at its start, which is late enough there (the
                # signal waits for its last wave); from all of a persistent grid at once it
                # would launch the dependent, and under PDL the dependent's dependents, onto
                # the SMs this kernel still streams on.
                if b + step >= nblocks:
                    gdc_launch_dependents()
            rn = b * BN + rb
            nn = rn + step * BN  # the next block's rows; masked off past N
            nptrs = w + nn[:, None] * swn + rj[None, :]
            wn = tl.load(nptrs, mask=(nn[:, None] < N) & k_mask, other=0.0)
            if SILU_MUL:
                wun = tl.load(nptrs + up, mask=(nn[:, None] < N) & k_mask, other=0.0)
            scn, scun = sc, scu  # unread without W_BLOCK
            if W_BLOCK:
                first = (b + step) * BN
                scn = _block_scales(w_scale, first, N, ssn, sk, in_k, SB_N)
                if SILU_MUL:
                    scun = _block_scales(w_scale, N + first, 2 * N, ssn, sk, in_k, SB_N)
            acc = _row_dots(wt, x0, x1, x2, x3, sc, BITS, W_BLOCK)
            if SILU_MUL:  # noqa: SIM108  # wu exists only with SILU_MUL (constexpr)
                acc_up = _row_dots(wu, x0, x1, x2, x3, scu, BITS, W_BLOCK)
            else:
                acc_up = acc  # unread
            y = _epilogue(acc, acc_up, out + rn, rn < N, w_scale, rn, N, rstd,
                          SILU_MUL, ADD_RES, NORM, W_SCALE)  # fmt: skip
            tl.store(out + rn, y, mask=rn < N)
            wt = wn
            sc, scu = scn, scun
            if SILU_MUL:
                wu = wun


@functools.cache
def _sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 2 elsewhere (Triton's interpreter), so a
    CPU test still runs programs that stride over several row blocks."""
    if device.type != "cuda":
        return 2
    return torch.cuda.get_device_properties(device).multi_processor_count


def _fused(
    x: torch.Tensor,
    w: torch.Tensor,
    n: int,
    pdl: bool,
    silu_mul: bool,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    eps: float | None,
    w_scale: torch.Tensor | None,
) -> tuple[torch.Tensor, dict]:
    """The output [M, n] (the residual itself where one is added in place) and the keyword
    arguments both GEMV kernels take for gemv's fused options and PDL."""
    m = x.shape[0]
    assert norm_weight is None or eps is not None, "norm_weight needs eps"
    if residual is not None:
        assert residual.shape == (m, n) and residual.stride(1) == 1, residual.shape
        out = residual
    else:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    return out, {
        "norm_w": norm_weight if norm_weight is not None else w,  # unread without NORM_G
        "eps": eps or 0.0,
        "w_scale": w_scale if w_scale is not None else w,  # unread without W_SCALE
        "PDL": pdl,
        "SILU_MUL": silu_mul,
        "ADD_RES": residual is not None,
        "NORM": eps is not None,
        "NORM_G": norm_weight is not None,
        "W_SCALE": w_scale is not None,
        "launch_pdl": pdl,
    }


def gemv(
    x: torch.Tensor,
    w: torch.Tensor,
    cfg: tuple,
    pdl: bool = False,
    silu_mul: bool = False,
    residual: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float | None = None,
    w_scale: torch.Tensor | None = None,
    w_block: tuple[int, int] | None = None,
) -> torch.Tensor:
    """x [M, K] @ w[N, K]^T with the Triton kernel and config (BLOCK_N, BLOCK_K, warps[,
    stages[, 1: tensor-core dots, or PERSISTENT_BITS: integer e4m3 decoding]]); without
    stages Triton's default software pipelining depth is used. A persistent config (is_persistent; M = 1 only) runs _gemv_rows_kernel. pdl=True
    launches it as a programmatic dependent of the previous kernel on the stream (Hopper+).

    silu_mul=True applies the gated MLP's activation in the epilogue: w is [gate; up] and the
    result [M, N/2] is silu(x @ gate^T) * (x @ up^T), equal bit for bit to
    fused_kernels.silu_and_mul of the unfused gemv with BLOCK_N / 2; a program still reads
    BLOCK_N weight rows, BLOCK_N / 2 of each half.

    norm_weight g (with eps) computes RMSNorm(x) * g @ w^T instead, the norm folded into the
    dot products (rstd * sum_k w[n, k] * x[k] * g[k]): each program sums x^2 along the x it
    loads anyway, so no norm kernel runs first. Not bit for bit the unfused result, which
    rounds the normalised x to the model dtype before the GEMV.

    eps alone (no norm_weight) computes RMSNorm(x) @ w^T: for a w whose columns the norm's
    weight already scales.

    residual r [M, N] makes the result r + x @ w^T, written into r in place (returned).

    w_scale [N] (float32) dequantizes a quantized w (float8_e4m3fn) row by row: the result
    is x @ (w * w_scale[:, None])^T, the scale applied to each dot product before the
    norm, activation and residual epilogues. x stays in its own dtype (weight-only
    dequantization: at these batch sizes reading w is the cost, not the arithmetic).

    w_block (bn, bk) makes w_scale [ceil(N / bn), ceil(K / bk)] one scale per block of w
    (block-wise FP8, e.g. Qwen3-FP8's 128 x 128): persistent configs only, whose row blocks
    must lie in one block of rows (BLOCK_N, halved with silu_mul, dividing bn; with silu_mul
    the up half starting on a block boundary).
    """
    m, k = x.shape
    n = w.shape[0]
    bn, bk, warps = cfg[:3]
    extra = {"num_stages": cfg[3]} if len(cfg) > 3 else {}
    if is_dense_down(cfg):
        if silu_mul or norm_weight is not None or eps is not None or w_block or w_scale is None:
            raise ValueError(f"{cfg} runs per-row scaled FP8 weights without a prologue")
        from mini_sglang.layers.moe.fused_moe_gemv import GemvTiles, channel_fp8_gemv

        return channel_fp8_gemv(x, w, w_scale, residual, GemvTiles(bn, bk, warps))
    if is_persistent(cfg):
        return _gemv_rows(x, w, cfg, pdl, silu_mul, residual, norm_weight, eps, w_scale, w_block)
    if w_block is not None:
        raise ValueError(f"block-wise weight scales take a persistent config, not {cfg}")
    launch = grid_launch(cfg, m, n, silu_mul)
    if launch["BITS"]:  # the kernel's tiles count int32 words of four weights
        w = e4m3_words(w, k)
    x_words = (
        launch["BITS"]
        and launch["BM"] == 1
        and _bf16_words(x)
        and (norm_weight is None or _bf16_words(norm_weight))
    )
    out_n = n // 2 if silu_mul else n
    out, fused = _fused(x, w, out_n, pdl, silu_mul, residual, norm_weight, eps, w_scale)
    programs = launch.pop("programs")
    _gemv_kernel[(programs,)](
        x,
        w,
        out,
        m,
        out_n,
        k,
        x.stride(0),
        w.stride(0),
        out.stride(0),
        IEEE=x.dtype == torch.float32,
        X_WORDS=x_words,
        num_warps=warps,
        **launch,
        **extra,
        **fused,
    )
    return out


def grid_launch(cfg: tuple, m: int, n: int, silu_mul: bool = False) -> dict:
    """_gemv_kernel's tile constants for a grid config (BLOCK_N, BLOCK_K, warps[, stages[,
    1 | PERSISTENT_BITS]]) at m rows of x and n weight rows, and its grid ("programs"):
    BM is m rounded up to a power of two (16 at least for tensor-core dots); a K tile
    shrinks by BM without dots, so a thread's tile stays bounded, and counts int32 words
    of four weights with BITS; with SiLU-mul a program reads BN / 2 gate and BN / 2 up
    rows. E.g. (8, 2048, 4, 2, 3) at 4 rows, n 5120: BM 4, BK 2048 / 4 / 4 = 128 words,
    BN 8, 640 programs."""
    bn, bk = cfg[:2]
    dot = len(cfg) > 4 and cfg[4] == 1
    bits = len(cfg) > 4 and cfg[4] == PERSISTENT_BITS
    bm = max(1, triton.next_power_of_2(m))
    if dot:
        bm = max(16, bm)  # tl.dot's smallest M; the extra rows are masked off
    elif bm > 1:
        bk = max(32, bk // bm)  # keep the per-thread register tile bounded
    if bits:
        bk = max(1, bk // 4)
    if silu_mul:
        assert n % 2 == 0 and bn >= 2, (n, cfg)
        if dot:  # tl.dot needs 16 gate rows a program: gate_up's pick is timed without SiLU
            bn = max(bn, 32)
        n, bn = n // 2, bn // 2
    return {"BM": bm, "BN": bn, "BK": bk, "DOT": dot, "BITS": bits,
            "programs": triton.cdiv(n, bn)}  # fmt: skip


def _bf16_words(v: torch.Tensor) -> bool:
    """Whether v (its first row, for a matrix) can be read as int64 words of four bf16
    (bf16_quads)."""
    return v.dtype == torch.bfloat16 and v.stride(-1) == 1 and v.data_ptr() % 8 == 0


def _gemv_rows(
    x: torch.Tensor,
    w: torch.Tensor,
    cfg: tuple,
    pdl: bool,
    silu_mul: bool,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    eps: float | None,
    w_scale: torch.Tensor | None,
    w_block: tuple[int, int] | None,
) -> torch.Tensor:
    """gemv with a persistent config (is_persistent): x of one row; the grid is
    programs-per-SM x the SM count, or fewer where there are fewer row blocks. With
    silu_mul a program reads BLOCK_N / 2 gate and as many up rows (at least one each)."""
    m, k = x.shape
    if m != 1:
        raise ValueError(f"the persistent GEMV takes one row of x, not {m}")
    n = w.shape[0]
    bn, _, warps, stages, kind, per_sm = cfg
    bits = kind == PERSISTENT_BITS
    if silu_mul:
        assert n % 2 == 0, (n, cfg)
        n, bn = n // 2, max(1, bn // 2)
    block = {"W_BLOCK": False, "SB_N": 1, "SB_K": 1, "ssn": 0}
    if w_block is not None:
        sb_n, sb_k = w_block
        assert w_scale is not None and w_scale.stride(1) == 1
        assert w_scale.shape == (-(-w.shape[0] // sb_n), -(-k // sb_k)), w_scale.shape
        assert sb_n % bn == 0 and (not silu_mul or n % sb_n == 0), (w_block, cfg, n)
        assert not bits or sb_k % 4 == 0, w_block  # a word's four weights share a block
        block = {"W_BLOCK": True, "SB_N": sb_n, "SB_K": sb_k // 4 if bits else sb_k,
                 "ssn": w_scale.stride(0)}  # fmt: skip
    out, fused = _fused(x, w, n, pdl, silu_mul, residual, norm_weight, eps, w_scale)
    fused["W_SCALE"] = fused["W_SCALE"] and w_block is None  # per-row scales only
    programs = min(triton.cdiv(n, bn), per_sm * _sm_count(x.device))
    wk = e4m3_words(w, k) if bits else w
    _gemv_rows_kernel[(programs,)](
        x,
        wk,
        out,
        n,
        k,
        wk.stride(0),
        BN=bn,
        BK=triton.next_power_of_2(k // 4 if bits else k),
        BITS=bits,
        num_warps=warps,
        num_stages=stages,
        **block,
        **fused,
    )
    return out


def _variant_kwargs(x: torch.Tensor, w: torch.Tensor, variant: tuple[str, ...]) -> dict:
    """gemv's keyword arguments for timing a fused variant: "silu_mul", "norm" (RMSNorm with
    g loaded) and "residual" (added in place) name gemv's options; "fp8" a per-row scaled
    FP8 weight, "fp8block{rows}x{cols}" a block-scaled one."""
    kwargs: dict = {"silu_mul": "silu_mul" in variant}
    if "fp8" in variant:
        kwargs["w_scale"] = torch.ones(w.shape[0], dtype=torch.float32, device=w.device)
    if (block := block_of(variant)) is not None:
        shape = (-(-w.shape[0] // block[0]), -(-w.shape[1] // block[1]))
        kwargs.update(
            w_scale=torch.ones(shape, dtype=torch.float32, device=w.device), w_block=block
        )
    if "norm" in variant:
        kwargs.update(eps=1e-6, norm_weight=torch.ones_like(x[0]))
    if "residual" in variant:
        kwargs["residual"] = x.new_zeros((x.shape[0], w.shape[0] // (1 + kwargs["silu_mul"])))
    return kwargs


def time_candidates(
    x: torch.Tensor, w: torch.Tensor, variant: tuple[str, ...] = ()
) -> dict[tuple | None, float]:
    """Milliseconds per x @ w^T, weight cold in L2, for cuBLAS (key None) and each Triton
    config the compiler accepts on this card, the Triton kernel as the given fused variant
    (see _variant_kwargs): a prologue or epilogue can change which config is fastest. For
    an FP8 weight key None times the layer's own path instead (_fp8_fallback). For the
    "norm" variant cuBLAS is timed with the RMSNorm kernel the layer runs before it when it
    does not fold the norm: the fold saves that kernel, so leaving it out of cuBLAS's side
    would compare the fold against a path that does not exist."""
    kwargs = _variant_kwargs(x, w, variant)
    if "fp8" in variant or block_of(variant) is not None:
        fallback = _fp8_fallback(x, w, kwargs)
        times: dict[tuple | None, float] = {
            None: float("inf") if fallback is None else cuda_time_ms(fallback, cold_l2=True)
        }
    elif "norm" in variant:
        from mini_sglang.layers.layernorm import RMSNorm  # deferred: it imports this module

        norm = RMSNorm(x.shape[1], kwargs["eps"]).to(device=x.device, dtype=x.dtype)
        times = {None: cuda_time_ms(lambda: F.linear(norm(x), w), cold_l2=True)}
    else:
        times = {None: cuda_time_ms(lambda: F.linear(x, w), cold_l2=True)}
    for cfg in candidates(variant, x.shape[0]):
        try:
            times[cfg] = cuda_time_ms(lambda cfg=cfg: gemv(x, w, cfg, **kwargs), cold_l2=True)
        except Exception:  # a config the compiler rejects on this card
            continue
    return times


# Per-row scaled FP8 layers' own GEMM where the pick is None: (gemm(x, w, w_scale), whether
# it serves x and w fast). Registered by the quantization method that runs it
# (register_fp8_channel_gemm), which imports this module, so this one cannot import it.
_fp8_channel_gemm: tuple[Callable, Callable[[torch.Tensor, torch.Tensor], bool]] | None = None


def register_fp8_channel_gemm(
    gemm: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    serves: Callable[[torch.Tensor, torch.Tensor], bool],
) -> None:
    """Sets the GEMM a per-row scaled FP8 layer runs where the GEMV pick is None, for
    time_candidates to time against the Triton configs."""
    global _fp8_channel_gemm
    _fp8_channel_gemm = (gemm, serves)


def _fp8_fallback(
    x: torch.Tensor, w: torch.Tensor, kwargs: dict
) -> Callable[[], torch.Tensor] | None:
    """The path of an FP8 layer where the pick is None, as a function to time, with the
    norm before it and the SiLU-mul after it as separate kernels, as the layer's method
    runs them; None where that path is not worth timing (always slower).

    Block-wise scales: fused_moe_gemv.block_fp8_gemv (the expert GEMVs' down kernel with one
    expert), the residual added in its epilogue. Per-row scales with the SiLU-mul: the plain
    variant's pick where it is a Triton config. Otherwise the GEMM registered with
    register_fp8_channel_gemm (fp8_kernels.fp8_linear: x quantized per token,
    torch._scaled_mm), then the residual add; None where that is the path and the GEMM does
    not serve x and w (fp8_linear would dequantize the whole weight) or none is registered.
    At 2-8 rows
    _scaled_mm beat the GEMV picks timed against nothing: Llama-3.1-8B at batch 2 / 4 took
    5.41 / 5.55 ms a step with every linear on it against 7.41 / 9.62 with the picks (one
    H100; docs/performance/decode-gemv.md)."""
    # deferred: these modules import this one (layernorm) or sit beside it (moe)
    from mini_sglang.layers.activation import SiluAndMul
    from mini_sglang.layers.layernorm import RMSNorm
    from mini_sglang.layers.moe.fused_moe_gemv import block_fp8_gemv

    scale, block, residual = kwargs["w_scale"], kwargs.get("w_block"), kwargs.get("residual")
    act = SiluAndMul() if kwargs["silu_mul"] else None
    # A per-row scaled gate_up whose fold loses runs the plain variant's pick, then the
    # activation (linear_silu_mul returns None, the method runs linear_scaled).
    plain = _config(x, w, ("fp8",)) if act and block is None else None
    gemm_serves = _fp8_channel_gemm is not None and _fp8_channel_gemm[1](x, w)
    if block is None and plain is None and not gemm_serves:
        return None
    norm = None
    if "eps" in kwargs:
        norm = RMSNorm(x.shape[1], kwargs["eps"]).to(device=x.device, dtype=x.dtype)

    def run() -> torch.Tensor:
        h = norm(x) if norm else x
        if block is not None:
            out = block_fp8_gemv(h, w, scale, block, residual=residual)
        elif plain is not None:
            out = gemv(h, w, plain, w_scale=scale, residual=residual)
        else:
            out = _fp8_channel_gemm[0](h, w, scale)
            if residual is not None:
                out = residual.add_(out)
        return act(out) if act else out

    return run


def choose(
    times: dict[tuple | None, float], margin: float = _MARGIN, credit_ms: float = 0.0
) -> tuple | None:
    """The pick from time_candidates' timings: the fastest Triton config if its time is at
    most margin x cuBLAS's + credit_ms, else None (cuBLAS)."""
    best = min((c for c in times if c is not None), key=times.__getitem__, default=None)
    if best is None or times[best] > times[None] * margin + credit_ms:
        return None
    return best


def pick_rule(x: torch.Tensor) -> dict:
    """choose's keyword arguments for inputs like x: a credit where the GEMV launches with PDL."""
    return {"credit_ms": _PDL_CREDIT_MS if pdl_enabled(x) else 0.0}


def _pick(x: torch.Tensor, w: torch.Tensor, variant: tuple[str, ...]) -> tuple | None:
    times = time_candidates(x, w, variant)
    # a block-scaled layer's fallback is a Triton GEMV launched under PDL too: no margin
    rule = {"margin": 1.0} if block_of(variant) is not None else pick_rule(x)
    best = choose(times, **rule)
    # key None: cuBLAS for a bf16 weight, the FP8 layer's own path (_fp8_fallback) otherwise
    none = "fallback" if "fp8" in variant or block_of(variant) is not None else "cuBLAS"
    logger.debug(
        "small-M GEMM M=%d N=%d K=%d %s: %s (%.1f us; %s %.1f us)",
        x.shape[0], w.shape[0], w.shape[1], variant, best or none, 1000 * times[best], none,
        1000 * times[None],
    )  # fmt: skip
    return best


def _config(
    x: torch.Tensor, w: torch.Tensor, variant: tuple[str, ...] = (), dense: bool = True
) -> tuple | None:
    """The Triton config to compute x @ w^T with as the fused variant (see _variant_kwargs;
    () is the plain GEMV), or None where F.linear (cuBLAS) serves: CPU, float32, more than
    MAX_M rows, or cuBLAS timed faster. dense=False skips CHANNEL_FP8_DENSE (a caller that
    folds a SiLU-mul into the plain variant's pick)."""
    if (
        not _ENABLED
        or triton is None
        or not x.is_cuda
        or x.dim() != 2
        or x.shape[0] > MAX_M
        or x.dtype not in (torch.bfloat16, torch.float16)
        or not x.is_contiguous()
        or (x.shape[0] > 1 and block_of(variant) is not None)
    ):
        return None
    # One pick per power-of-two bucket of M: the kernel pads M to that size anyway (BM), and
    # the CUDA-graph warm-up (batches 1, 2, 4, 8) then covers every bucket, so no pick ever
    # runs mid-serving, e.g. for the LM head of a prefill batch of 3 requests. A pick costs
    # ~0.1 s of graph captures; timing each new M at run time cost 15% of Llama-3.1-8B's
    # nano-vllm throughput.
    bucket = triton.next_power_of_2(x.shape[0])
    if dense and (choice := channel_fp8_dense_choice(w, variant, bucket)) != ():
        return choice  # not cached: linear_silu_mul's key is the plain variant's
    key = (bucket, w.shape[0], w.shape[1], x.dtype, variant)
    if key not in _choice:
        if torch.cuda.is_current_stream_capturing():
            return None
        forced = forced_choice(_FORCED.get(tuple(w.shape), ()), w, variant, bucket)
        if forced != ():
            _choice[key] = forced
            logger.debug("small-M GEMM N=%d K=%d %s: %s (forced)", *w.shape, variant, forced)
        else:
            _choice[key] = _stored_or_timed(key, x, w, variant)
    return _choice[key]


def forced_choice(
    forced: tuple | None, w: torch.Tensor, variant: tuple[str, ...], bucket: int
) -> tuple | None:
    """The choice a config forced for w's shape (MINI_SGLANG_GEMV_CONFIGS; () where none is)
    makes for `variant` at M's power-of-two bucket, or () where the timed pick stands: a
    persistent config serves one row only, and a config w or the variant cannot run is
    ignored (_fits), except that a DENSE_DOWN one runs the shape's norm and SiLU-mul
    variants unfused (None: the prologue's own kernel, then the plain variant on it)."""
    if forced == ():
        return ()
    if _fits(forced, w, variant):
        return forced if bucket == 1 or not is_persistent(forced) else ()
    if is_dense_down(forced) and _fits(forced, w, _plain(variant)):
        return None
    return ()


def _plain(variant: tuple[str, ...]) -> tuple[str, ...]:
    """variant without the norm and SiLU-mul that a GEMV may fold in (the weight's format
    and the residual epilogue stay)."""
    return tuple(v for v in variant if v not in ("norm", "silu_mul"))


def _fits(cfg: tuple | None, w: torch.Tensor, variant: tuple[str, ...]) -> bool:
    """Whether a forced config can run w as `variant`: an integer-decoding one
    (PERSISTENT_BITS) only an FP8 weight, e.g. not a bf16 layer of the same shape that a
    checkpoint left unquantized; a block-scaled weight only None (its own GEMV) or a
    persistent config; DENSE_DOWN only a per-row scaled FP8 weight with no prologue."""
    if block_of(variant) is not None and cfg is not None and not is_persistent(cfg):
        return False
    if is_dense_down(cfg) and ("fp8" not in variant or _plain(variant) != variant):
        return False
    bits = cfg is not None and len(cfg) > 4 and cfg[4] == PERSISTENT_BITS
    return not bits or w.dtype == torch.float8_e4m3fn


def _choice_key(key: tuple) -> str:
    """kernel_choices' key for a _choice key, e.g. "M8|N4096|K4096|bfloat16|silu_mul"."""
    bucket, n, k, dtype, variant = key
    return f"M{bucket}|N{n}|K{k}|{str(dtype).removeprefix('torch.')}|{'+'.join(variant) or 'plain'}"


def _stored_or_timed(
    key: tuple, x: torch.Tensor, w: torch.Tensor, variant: tuple[str, ...]
) -> tuple | None:
    """The pick for `key`: shipped or cached for this card (kernel_choices) when it names a
    current candidate, else timed now and cached for the next start."""
    name, card = _choice_key(key), kernel_choices.device_name(x.device)
    stored = kernel_choices.lookup("gemv", card, name)
    if stored is None:
        return None
    if isinstance(stored, list) and tuple(stored) in candidates(variant):
        return tuple(stored)
    best = _pick(torch.randn((key[0], x.shape[1]), dtype=x.dtype, device=x.device), w, variant)
    kernel_choices.record("gemv", card, name, list(best) if best else None)
    return best


def norm_fusion_config(x: torch.Tensor, w: torch.Tensor, variant: tuple[str, ...]) -> tuple | None:
    """_config for a variant that takes work from a norm kernel; always None (the caller runs
    the unfused kernels) with MINI_SGLANG_DISABLE_GEMV_NORM_FUSION=1."""
    return _config(x, w, variant) if FUSE_NORM else None


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, w, bias), through the Triton GEMV where _config picks it."""
    cfg = _config(x, w)
    if cfg is None:
        return F.linear(x, w, bias)
    out = gemv(x, w, cfg, pdl=pdl_enabled(x))
    return out + bias if bias is not None else out


def linear_scaled(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    w_block: tuple[int, int] | None = None,
) -> torch.Tensor | None:
    """x @ (w * w_scale[:, None])^T for an FP8 w with per-row scales, through the Triton GEMV
    where _config picks it (the "fp8" variant: CUDA, at most MAX_M rows), else None: the
    caller then runs its FP8 GEMM. With w_block, w_scale holds one scale per block of w
    (gemv's w_block; one row of x only) and None leaves the caller its block-wise path."""
    cfg = _config(x, w, _scaled((), w_scale, w_block))
    if cfg is None:
        return None
    return gemv(x, w, cfg, pdl=pdl_enabled(x), w_scale=w_scale, w_block=w_block)


def _scaled(
    variant: tuple[str, ...], w_scale: torch.Tensor | None, w_block: tuple[int, int] | None
) -> tuple[str, ...]:
    """The variant for a weight with per-row scales ("fp8"), block scales
    ("fp8block{rows}x{cols}") or none."""
    if w_scale is None:
        return variant
    return (*variant, "fp8" if w_block is None else f"fp8block{w_block[0]}x{w_block[1]}")


def linear_silu_mul(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor | None = None,
    w_block: tuple[int, int] | None = None,
) -> torch.Tensor | None:
    """silu(x @ gate^T) * (x @ up^T) for w = [gate; up] in one Triton GEMV where linear would
    use the Triton GEMV for x @ w^T, else None: the caller then runs linear and the
    activation itself. At batch 1 this saves the SiLU-mul kernel of every MLP.
    MINI_SGLANG_DISABLE_GEMV_SILU_FUSION=1 always returns None. w_scale, w_block: see
    linear_scaled."""
    if not _FUSE_SILU_MUL:
        return None
    # An FP8 weight's pick is timed with the SiLU-mul, against its fallback with the
    # activation kernel: the fold doubles a tensor-core dot program's rows (grid_launch).
    # A bf16 weight reuses the plain GEMV's pick.
    variant = _scaled(("silu_mul",) if w_scale is not None else (), w_scale, w_block)
    cfg = _config(x, w, variant, dense=False)
    if cfg is None or is_dense_down(cfg):  # DENSE_DOWN has no SiLU-mul epilogue
        return None
    return gemv(x, w, cfg, pdl=pdl_enabled(x), silu_mul=True, w_scale=w_scale, w_block=w_block)


def linear_rmsnorm(
    x: torch.Tensor,
    w: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    w_scale: torch.Tensor | None = None,
    w_block: tuple[int, int] | None = None,
) -> torch.Tensor | None:
    """RMSNorm(x) * norm_weight @ w^T in one Triton GEMV (see gemv's norm_weight) where linear
    would use the Triton GEMV, else None and the caller runs the norm itself.
    MINI_SGLANG_DISABLE_GEMV_NORM_FUSION=1 always returns None. w_scale, w_block: see
    linear_scaled."""
    cfg = norm_fusion_config(x, w, _scaled(("norm",), w_scale, w_block))
    if cfg is None:
        return None
    return gemv(
        x, w, cfg, pdl=pdl_enabled(x), norm_weight=norm_weight, eps=eps, w_scale=w_scale,
        w_block=w_block,
    )  # fmt: skip


def rmsnorm_silu_mul_fold(
    x: torch.Tensor,
    w: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    w_scale: torch.Tensor | None = None,
    w_block: tuple[int, int] | None = None,
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """For inputs like x (shape and dtype; its values are not read): a function computing
    silu(h @ gate^T) * (h @ up^T), h = RMSNorm(r) * norm_weight, for w = [gate; up] in one
    GEMV, where the pick for the norm variant of w is a persistent config; else None, and
    the caller runs the norm kernel and linear_silu_mul. Asked before r holds its value, so a
    layer can choose its dataflow (o_proj adding into r, or the add-RMSNorm kernel) first.

    Only persistent programs: each loads x and g once for all its row blocks. A grid
    program loads them again for every block, and in the largest GEMV that cost more than
    the norm kernel it saves (docs/performance/decode-gemv.md, "the full fold").
    MINI_SGLANG_DISABLE_GEMV_MLP_NORM_FOLD=1 always returns None. w_scale, w_block: see
    linear_scaled."""
    if not (_FOLD_MLP_NORM and _FUSE_SILU_MUL) or x.shape[0] != 1:
        return None
    variant = ("norm", "silu_mul") if w_block else ("norm",)
    cfg = norm_fusion_config(x, w, _scaled(variant, w_scale, w_block))
    if not is_persistent(cfg):
        return None
    pdl = pdl_enabled(x)
    return lambda r: gemv(
        r, w, cfg, pdl=pdl, silu_mul=True, norm_weight=norm_weight, eps=eps, w_scale=w_scale,
        w_block=w_block,
    )  # fmt: skip


def linear_add_(
    x: torch.Tensor,
    w: torch.Tensor,
    residual: torch.Tensor,
    w_scale: torch.Tensor | None = None,
    w_block: tuple[int, int] | None = None,
) -> bool:
    """residual += x @ w^T in place, in the Triton GEMV's epilogue, where linear would use the
    Triton GEMV; returns False (residual untouched) otherwise. w_scale, w_block: see
    linear_scaled."""
    cfg = norm_fusion_config(x, w, _scaled(("residual",), w_scale, w_block))
    if cfg is None:
        return False
    gemv(x, w, cfg, pdl=pdl_enabled(x), residual=residual, w_scale=w_scale, w_block=w_block)
    return True

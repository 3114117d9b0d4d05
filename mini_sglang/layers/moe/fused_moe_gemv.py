"""The experts for a few tokens (decode): two GEMV kernels, no alignment, no sort.

fused_experts_gemv computes what experts_torch.fused_experts_torch does (and what
fused_moe_triton.fused_experts_triton does, up to summation order) in two launches:

1. gate/up: one program per (token-expert pair, block of BLOCK_N intermediate columns) reads
   the token's hidden row and its expert's BLOCK_N gate rows and BLOCK_N up rows of w13 in
   BLOCK_K-wide tiles (fp32 accumulate), and writes silu(gate) * up -> act [pairs, I];
2. down: one program per (token, block of BLOCK_N hidden columns) loads the token's k
   experts' w2 tiles together ([k, BLOCK_N, BLOCK_K] per K step, so k times a GEMV's bytes
   are in flight): act[pair] @ w2[expert][rows]^T, times the pair's routing weight, summed
   over the k pairs in registers (no atomics, no per-pair output, no separate sum). Under
   PDL it reads the ids and loads its first w2 tiles before it waits for kernel 1's act:
   kernel 1 lets it launch only after its own wait on the kernel before it (the top-k
   kernel, which wrote the ids), so the ids are final when it starts.

A decode step of the grouped-GEMM path runs the alignment (sorting pairs into 16-row blocks
of which one row is used at batch 1), both GEMMs and the sum; here each weight row a token
needs is streamed once per pair, as the dense decode GEMV (layers/small_m_gemm.py) streams
a linear layer: narrow row blocks (many programs), wide K tiles, fp32 accumulation. Pairs of
one expert from different tokens each read the expert's rows, so the grouped GEMM wins once
tokens share experts; MAX_TOKENS (MINI_SGLANG_MOE_SMALL_M, default 4; 0: off) is the largest
batch fused_experts_triton sends here.

A pair whose expert id is negative (an expert another rank holds) is skipped by kernel 1
(its act row is never written) and masked out of kernel 2's loads, so it adds nothing. The
grid depends only on (tokens, k, H, I), and nothing is read back to the host: CUDA graphs
capture it at each batch size.

FP8 experts (fused_moe_triton.Fp8Experts) compute the w8a8 function of the grouped path: x
and the SiLU-and-mul output are quantized by fp8.quantize (per token, or per token and group
of bk columns) before their kernel, which multiplies the FP8 values in fp32 and applies the
activation and weight scales in its epilogue (per channel) or at each K step (block-wise;
BLOCK_K then divides bk).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from mini_sglang.environ import envs

if TYPE_CHECKING:
    from mini_sglang.layers.moe.fused_moe_triton import Fp8Experts

# Batches of at most this many tokens take this path in fused_experts_triton (0: never).
# Read once at import; benchmarks set the attribute to compare both paths in one process.
MAX_TOKENS = envs.MINI_SGLANG_MOE_SMALL_M.get()

_kernels: tuple | None = None


@dataclass(frozen=True)
class GemvTiles:
    """One kernel's launch shape: BLOCK_N output columns per program, BLOCK_K-wide tiles of
    the reduction dimension, num_warps, and num_stages (None: Triton's default) for the
    compiler's software pipelining of the K loop."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int | None = None

    def launch_options(self) -> dict:
        """The launch's num_warps / num_stages keyword arguments."""
        stages = {} if self.num_stages is None else {"num_stages": self.num_stages}
        return {"num_warps": self.num_warps, **stages}


@dataclass(frozen=True)
class SmallMConfig:
    """The tiles of both kernels: `gate_up` (kernel 1, BLOCK_N intermediate columns: it
    reads 2 * BLOCK_N w13 rows) and `down` (kernel 2, BLOCK_N hidden columns)."""

    gate_up: GemvTiles
    down: GemvTiles


# Narrow row blocks (many programs in flight at batch 1) and wide K tiles, as the dense
# decode GEMV's best configs; kernel 2 loads k such tiles at once, hence more warps.
# bench_fused_moe.py --small-m-sweep times alternatives.
DEFAULT_CONFIG = SmallMConfig(GemvTiles(4, 512, 4), GemvTiles(4, 256, 8))
# Tiles by batch bucket (tokens rounded up to a power of two), from bench_fused_moe.py
# --small-m-sweep on an H200 with Qwen3-30B-A3B's shapes (E 128, top-8, H 2048, I 768;
# docs/results/fused_moe_small_m_bf16_fp8_block_h200.log): kernel 1 fastest at one warp a
# program at 1-4 tokens. Per layer call against the four-warp tiles: M=1 22.6 vs 23.4 us,
# M=2 39.2 vs 40.2, M=4 75.2 vs 76.6; Qwen3-30B-A3B batch 1: 2.538 / 2.588 ms/token against
# 2.571 / 2.602 (moe_decode_ab_qwen3_30b_a3b_h200.log). At M=8 the grouped GEMM is faster
# than either (139.4 against 147.9 us, fused_moe_small_m_h200.log), hence
# MINI_SGLANG_MOE_SMALL_M's default 4.
TUNED: dict[int, SmallMConfig] = {
    1: SmallMConfig(GemvTiles(2, 1024, 1), GemvTiles(4, 256, 8)),
    2: SmallMConfig(GemvTiles(2, 1024, 1), GemvTiles(4, 256, 8)),
    4: SmallMConfig(GemvTiles(4, 512, 1), GemvTiles(4, 256, 8)),
}
# FP8 experts with 128 x 128 block scales (Qwen3-30B-A3B-FP8's checkpoint format): BLOCK_K
# is one scale group, 128 (see _tiles), so a program covers more rows instead. Same sweep,
# against DEFAULT_CONFIG and the grouped GEMM: M=1 24.2 vs 30.1 and 28.0 us, M=2 33.1 vs
# 50.0 and 37.7, M=4 52.6 vs 81.9 and 55.1. Per-channel FP8 experts, not swept, keep
# DEFAULT_CONFIG.
TUNED_FP8_BLOCK: dict[int, SmallMConfig] = {
    1: SmallMConfig(GemvTiles(16, 128, 8), GemvTiles(4, 128, 4)),
    2: SmallMConfig(GemvTiles(16, 128, 8), GemvTiles(8, 128, 4)),
    4: SmallMConfig(GemvTiles(16, 128, 4), GemvTiles(8, 128, 4)),
}
_TUNED_BY_QUANT = {None: TUNED, "fp8-block": TUNED_FP8_BLOCK}


def _parse_tiles(spec: str) -> GemvTiles:
    """ "block_n,block_k,warps[,stages]" (stages 0: Triton's default)."""
    bn, bk, warps, stages = ([int(v) for v in spec.split(",")] + [0])[:4]
    return GemvTiles(bn, bk, warps, stages or None)


def _parse_forced(spec: str) -> dict[int, tuple[GemvTiles, GemvTiles | None]]:
    """MINI_SGLANG_MOE_GEMV_TILES, for experiments: ';'- or '/'-separated
    "bucket=gate_up[:down]" entries that replace the tiles of that batch bucket (a power of
    two) in every format, e.g. "1=4,512,4" runs kernel 1 at one token with BLOCK_N 4,
    BLOCK_K 512 and 4 warps, kernel 2 as tuned."""
    forced = {}
    for entry in filter(None, re.split("[;/]", spec)):
        bucket, tiles = entry.split("=")
        gate_up, _, down = tiles.partition(":")
        forced[int(bucket)] = (_parse_tiles(gate_up), _parse_tiles(down) if down else None)
    return forced


_FORCED = _parse_forced(envs.MINI_SGLANG_MOE_GEMV_TILES.get())


def default_config(tokens: int, quant: str | None) -> SmallMConfig:
    """The tiles fused_experts_gemv launches for a batch of `tokens` tokens (>= 1) when no
    config is given: for experts in format `quant` (None: bf16/fp16; else Fp8Experts.kind)
    the tuned entry for the batch's power-of-two bucket, else DEFAULT_CONFIG; tiles forced
    for the bucket (MINI_SGLANG_MOE_GEMV_TILES) replace either kernel's."""
    bucket = 1 << (tokens - 1).bit_length()
    config = _TUNED_BY_QUANT.get(quant, {}).get(bucket, DEFAULT_CONFIG)
    if bucket in _FORCED:  # MINI_SGLANG_MOE_GEMV_TILES
        gate_up, down = _FORCED[bucket]
        config = SmallMConfig(gate_up, down or config.down)
    return config


def use_small_m(tokens: int) -> bool:
    """True if a batch of `tokens` tokens takes this path (1 <= tokens <= MAX_TOKENS)."""
    return 0 < tokens <= MAX_TOKENS


def _build_kernels() -> tuple:  # noqa: C901  # the kernels' constexpr branches count here too
    import triton  # deferred: the CPU path never needs it
    import triton.language as tl

    from mini_sglang.layers.kernels import gdc_launch_dependents, gdc_wait

    @triton.jit
    def gate_up_kernel(
        x_ptr,
        w_ptr,
        act_ptr,
        x_scale_ptr,
        w_scale_ptr,
        ids_ptr,
        INTER,
        H,
        stride_xm,
        stride_we,
        stride_wn,
        stride_am,
        stride_xsm,
        stride_wse,
        stride_wsn,
        TOP_K: tl.constexpr,
        FP8: tl.constexpr,
        GROUP_N: tl.constexpr,
        GROUP_K: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        PDL: tl.constexpr,
    ):
        """act[pair, n] = silu(x[token] . w[e, n]) * (x[token] . w[e, INTER + n]) for the
        program's BLOCK_N columns n, e = ids[pair], token = pair // TOP_K; nothing for
        e < 0. FP8: x and w hold FP8 values; x_scale [M, 1 or H / GROUP_K], w_scale
        [E, 2I / GROUP_N, 1 or H / GROUP_K] (GROUP_K 0: per channel, in the epilogue).
        PDL: launched as a programmatic dependent; every read here (the ids first, which
        pick the weights) waits for the kernel before, and so does the launch of the down
        kernel, which reads the ids before its own wait."""
        if PDL:
            gdc_wait()
            gdc_launch_dependents()
        pid_n = tl.program_id(0)
        pair = tl.program_id(1)
        expert = tl.load(ids_ptr + pair)
        if expert < 0:
            return
        expert = expert.to(tl.int64)
        token = (pair // TOP_K).to(tl.int64)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = rn < INTER
        gate_rows = w_ptr + expert * stride_we + rn[:, None].to(tl.int64) * stride_wn
        up_rows = gate_rows + INTER * stride_wn
        x_row = x_ptr + token * stride_xm
        if FP8:
            w_s = w_scale_ptr + expert * stride_wse
            gate_s = w_s + (rn // GROUP_N) * stride_wsn
            up_s = w_s + ((rn + INTER) // GROUP_N) * stride_wsn
            x_s = x_scale_ptr + token * stride_xsm
        acc_g = tl.zeros((BLOCK_N,), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for k0 in range(0, H, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            k_ok = rk < H
            w_ok = n_ok[:, None] & k_ok[None, :]
            xk = tl.load(x_row + rk, mask=k_ok, other=0.0).to(tl.float32)[None, :]
            g = tl.load(gate_rows + rk[None, :], mask=w_ok, other=0.0).to(tl.float32)
            u = tl.load(up_rows + rk[None, :], mask=w_ok, other=0.0).to(tl.float32)
            part_g = tl.sum(g * xk, axis=1)
            part_u = tl.sum(u * xk, axis=1)
            if FP8 and GROUP_K > 0:  # this K step's scale group
                grp = k0 // GROUP_K
                a_s = tl.load(x_s + grp)
                part_g = part_g * a_s * tl.load(gate_s + grp, mask=n_ok, other=0.0)
                part_u = part_u * a_s * tl.load(up_s + grp, mask=n_ok, other=0.0)
            acc_g += part_g
            acc_u += part_u
        if FP8 and GROUP_K == 0:
            a_s = tl.load(x_s)
            acc_g = acc_g * a_s * tl.load(gate_s, mask=n_ok, other=0.0)
            acc_u = acc_u * a_s * tl.load(up_s, mask=n_ok, other=0.0)
        # rounded to the activation dtype first, as the grouped GEMM's epilogue does
        gate = acc_g.to(act_ptr.dtype.element_ty).to(tl.float32)
        up = acc_u.to(act_ptr.dtype.element_ty).to(tl.float32)
        y = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(act_ptr + pair * stride_am + rn, y.to(act_ptr.dtype.element_ty), mask=n_ok)

    @triton.jit
    def down_kernel(
        act_ptr,
        w_ptr,
        out_ptr,
        act_scale_ptr,
        w_scale_ptr,
        ids_ptr,
        topk_weights_ptr,
        H,
        INTER,
        stride_am,
        stride_we,
        stride_wn,
        stride_om,
        stride_asm,
        stride_wse,
        stride_wsn,
        TOP_K: tl.constexpr,
        TOP_K_POW2: tl.constexpr,
        FP8: tl.constexpr,
        GROUP_N: tl.constexpr,
        GROUP_K: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        ADD_OUT: tl.constexpr,
        PDL: tl.constexpr,
    ):
        """out[token, n] = sum over the token's pairs p with ids[p] >= 0 of
        topk_weights[p] * (act[p] . w[ids[p], n]) for the program's BLOCK_N columns n,
        accumulated in fp32 and rounded once; with ADD_OUT, out[token, n] += that sum (out
        is then the residual stream, added in fp32 and rounded once, as the dense GEMV's
        residual epilogue). All k experts' tiles are one [TOP_K_POW2, BLOCK_N, BLOCK_K]
        load per K step, so a program has k times a GEMV's bytes in flight. FP8: act and w
        hold FP8 values; act_scale [pairs, 1 or INTER / GROUP_K], w_scale [E, H / GROUP_N,
        1 or INTER / GROUP_K]. PDL: launched as a programmatic dependent of gate_up_kernel,
        once the ids are final (see there): the ids, routing weights and first w tiles load
        before the wait for act."""
        if PDL:
            gdc_launch_dependents()
        pid_n = tl.program_id(0)
        token = tl.program_id(1).to(tl.int64)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = rn < H
        rj = tl.arange(0, TOP_K_POW2)
        pairs = token * TOP_K + rj
        expert = tl.load(ids_ptr + pairs, mask=rj < TOP_K, other=-1)
        # A dropped pair (or a padding slot) reads nothing (its act row and scales were never
        # written) and adds 0; its expert id is clamped so that no pointer leaves the weights.
        kept = expert >= 0
        expert = tl.maximum(expert, 0).to(tl.int64)
        rows = (
            w_ptr + expert[:, None, None] * stride_we + rn[None, :, None].to(tl.int64) * stride_wn
        )
        rows_ok = kept[:, None, None] & n_ok[None, :, None]
        a_rows = act_ptr + pairs[:, None] * stride_am
        if FP8:
            w_s = w_scale_ptr + expert[:, None] * stride_wse + (rn[None, :] // GROUP_N) * stride_wsn
            w_s_ok = kept[:, None] & n_ok[None, :]
            a_s_rows = act_scale_ptr + pairs * stride_asm
        route = tl.load(topk_weights_ptr + pairs, mask=kept, other=0.0).to(tl.float32)
        # w's K tiles are loaded one step ahead (the first one before the wait); the step
        # after the last loads nothing (all masked)
        rk = tl.arange(0, BLOCK_K)
        w = tl.load(rows + rk[None, None, :], mask=rows_ok & (rk < INTER)[None, None, :], other=0.0)
        if PDL:
            gdc_wait()
        acc = tl.zeros((TOP_K_POW2, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, INTER, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            k_ok = rk < INTER
            a = tl.load(a_rows + rk[None, :], mask=kept[:, None] & k_ok[None, :], other=0.0)
            part = tl.sum(w.to(tl.float32) * a.to(tl.float32)[:, None, :], axis=2)
            nk = rk + BLOCK_K
            w = tl.load(
                rows + nk[None, None, :], mask=rows_ok & (nk < INTER)[None, None, :], other=0.0
            )
            if FP8 and GROUP_K > 0:
                grp = k0 // GROUP_K
                a_s = tl.load(a_s_rows + grp, mask=kept, other=0.0)
                part = part * a_s[:, None] * tl.load(w_s + grp, mask=w_s_ok, other=0.0)
            acc += part
        if FP8 and GROUP_K == 0:
            a_s = tl.load(a_s_rows, mask=kept, other=0.0)
            acc = acc * a_s[:, None] * tl.load(w_s, mask=w_s_ok, other=0.0)
        out = tl.sum(acc * route[:, None], axis=0)
        out_row = out_ptr + token * stride_om + rn
        if ADD_OUT:  # this program alone reads and writes these columns of the row
            out += tl.load(out_row, mask=n_ok, other=0.0).to(tl.float32)
        tl.store(out_row, out.to(out_ptr.dtype.element_ty), mask=n_ok)

    return gate_up_kernel, down_kernel


def _get_kernels() -> tuple:
    global _kernels
    if _kernels is None:
        _kernels = _build_kernels()
    return _kernels


def _tiles(tiles: GemvTiles, group_k: int) -> tuple[int, int]:
    """(BLOCK_N, BLOCK_K) for a launch; block-wise scales need one scale group per K step."""
    block_k = math.gcd(tiles.block_k, group_k) if group_k else tiles.block_k
    return tiles.block_n, block_k


def fused_experts_gemv(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    fp8: Fp8Experts | None = None,
    config: SmallMConfig | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, H], w13 [E, 2I, H], w2 [E, H, I], topk_* [M, k] -> [M, H] in x's dtype: the
    routing-weighted sum of each token's experts (see the module); negative ids add
    nothing. `fp8`: FP8 experts, w8a8 as fused_experts_triton runs them. `config`: the
    tiles (default_config if None). `residual` ([M, H], x's dtype, rows contiguous): the
    sum is added into it in the down kernel's epilogue and residual is returned. Both
    kernels launch as programmatic dependents where kernels.pdl_enabled(x)."""
    import triton

    from mini_sglang.layers.kernels import pdl_enabled

    tokens, k = topk_ids.shape
    _, two_i, hidden = w13.shape
    inter = two_i // 2
    if tokens == 0:
        return torch.zeros_like(x) if residual is None else residual
    pdl = pdl_enabled(x)
    config = config or default_config(tokens, fp8.kind if fp8 is not None else None)
    gate_up_kernel, down_kernel = _get_kernels()
    assert w13.stride(2) == 1 and w2.stride(2) == 1
    ids = topk_ids.reshape(-1).contiguous()
    weights = topk_weights.reshape(-1).contiguous()
    x = x.contiguous()
    group_n, group_k = fp8.block if fp8 is not None and fp8.block is not None else (1, 0)
    group = group_k or None
    a, a_scale, w_scale = x, x, w13  # unread placeholders without FP8
    if fp8 is not None:
        a, a_scale = fp8.quantize(x, group)
        w_scale = fp8.w13_scale
    act = torch.empty(tokens * k, inter, dtype=x.dtype, device=x.device)
    bn, bk = _tiles(config.gate_up, group_k)
    gate_up_kernel[(triton.cdiv(inter, bn), tokens * k)](
        a,
        w13,
        act,
        a_scale,
        w_scale,
        ids,
        inter,
        hidden,
        a.stride(0),
        w13.stride(0),
        w13.stride(1),
        act.stride(0),
        a_scale.stride(0),
        w_scale.stride(0),
        w_scale.stride(1),
        TOP_K=k,
        FP8=fp8 is not None,
        GROUP_N=group_n,
        GROUP_K=group_k,
        BLOCK_N=bn,
        BLOCK_K=bk,
        PDL=pdl,
        **config.gate_up.launch_options(),
        launch_pdl=pdl,
    )
    a, a_scale, w_scale = act, act, w2
    if fp8 is not None:
        a, a_scale = fp8.quantize(act, group)
        w_scale = fp8.w2_scale
    if residual is not None:
        assert residual.shape == (tokens, hidden) and residual.dtype == x.dtype
        assert residual.stride(1) == 1
    out = (
        torch.empty(tokens, hidden, dtype=x.dtype, device=x.device)
        if residual is None
        else residual
    )
    bn, bk = _tiles(config.down, group_k)
    down_kernel[(triton.cdiv(hidden, bn), tokens)](
        a,
        w2,
        out,
        a_scale,
        w_scale,
        ids,
        weights,
        hidden,
        inter,
        a.stride(0),
        w2.stride(0),
        w2.stride(1),
        out.stride(0),
        a_scale.stride(0),
        w_scale.stride(0),
        w_scale.stride(1),
        TOP_K=k,
        TOP_K_POW2=triton.next_power_of_2(k),
        FP8=fp8 is not None,
        GROUP_N=group_n,
        GROUP_K=group_k,
        BLOCK_N=bn,
        BLOCK_K=bk,
        ADD_OUT=residual is not None,
        PDL=pdl,
        **config.down.launch_options(),
        launch_pdl=pdl,
    )
    return out

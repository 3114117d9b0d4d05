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

FP8 experts (fused_moe_triton.Fp8Experts) are dequantized as they are read: x and the
SiLU-and-mul output stay in x's dtype, each weight tile is converted to fp32, and its scales
apply per output row in the epilogue (per channel) or, block-wise, to x's columns before
the multiply (a program's rows lie in one scale block, so a K tile needs one scale per
column). The weights are read as int32 words of four and decoded with integer ops
(layers/e4m3_decode.py, as the dense FP8 GEMV does): Triton's float8 cast held these GEMVs
to about 1.5 TB/s. MINI_SGLANG_FP8_GEMV_INT_DECODE=0 goes back to the cast (its own tiles).
At these batch sizes streaming the weights is the cost; quantizing the activations, as the
grouped path's w8a8 does, would add two kernels to the chain and round x to FP8 for no
saving (the dense FP8 GEMV of layers/small_m_gemm.py reads them unquantized too).

block_fp8_gemv runs the down kernel with one expert for a dense linear layer with
block-wise FP8 weights (Qwen3-FP8's attention projections) at these batch sizes.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from mini_sglang.environ import envs
from mini_sglang.layers import e4m3_decode
from mini_sglang.layers.e4m3_decode import e4m3_words

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
# FP8 experts with 128 x 128 block scales (Qwen3-30B-A3B-FP8's checkpoint format): BLOCK_N
# divides the block's 128 rows (see _tiles). From bench_fused_moe.py --dtype fp8-block
# --small-m-sweep on an H100 (docs/results/fused_moe_small_m_fp8_block_dequant_h100.log):
# per layer call 19.0 / 34.1 / 64.8 us at 1 / 2 / 4 tokens, against 35.5 / 36.1 / 69.0 with
# the tiles swept when the kernels quantized the activations (one scale group a K step) and
# 30.6 / 51.4 / 103.0 for bf16 experts on the same card. Per-channel FP8 experts under the
# cast keep DEFAULT_CONFIG (TUNED_FP8_WORDS: theirs under the integer decoding).
TUNED_FP8_BLOCK: dict[int, SmallMConfig] = {
    1: SmallMConfig(GemvTiles(2, 1024, 1), GemvTiles(8, 256, 8, 3)),
    2: SmallMConfig(GemvTiles(2, 1024, 1), GemvTiles(16, 128, 16)),
    4: SmallMConfig(GemvTiles(2, 1024, 1), GemvTiles(8, 128, 4)),
}
# TUNED_FP8_BLOCK for the weights decoded as int32 words (e4m3_decode; the default), from
# bench_fused_moe.py --dtype fp8-block --small-m-sweep on an H100 (docs/results/
# fused_moe_small_m_fp8_block_int_decode_h100.log, fused_moe_small_m_fp8_words_h100.log):
# per layer call 19.4 / 33.3 / 56.0 us at 1 / 2 / 4 tokens against 21.4 / 36.0 / 67.0 with
# TUNED_FP8_BLOCK's tiles. Qwen3-30B-A3B-FP8 decode steps (ms): 2.553 / 2.554 against
# 2.567 / 2.561 at batch 1 (moe_fp8_block_int_decode_ab_qwen3_30b_a3b_h100.log), 3.280 /
# 3.276 against 3.415 / 3.416 at 2 and 4.968 / 4.967 against 5.607 / 5.606 at 4
# (moe_fp8_words_tiles_ab_qwen3_30b_a3b_h100.log).
TUNED_FP8_BLOCK_WORDS: dict[int, SmallMConfig] = {
    1: SmallMConfig(GemvTiles(4, 512, 1), GemvTiles(16, 256, 16)),
    2: SmallMConfig(GemvTiles(4, 512, 4), GemvTiles(16, 128, 16)),
    4: SmallMConfig(GemvTiles(8, 256, 4), GemvTiles(16, 128, 4)),
}
# Per-channel FP8 experts (--quantization fp8) decoded as int32 words, from the same sweep
# (--dtype fp8): 17.5 / 29.8 / 55.7 us at 1 / 2 / 4 tokens, where DEFAULT_CONFIG took 17.5
# / 32.1 / 61.8 (one token keeps it). Qwen3-30B-A3B --quantization fp8 decode steps (ms):
# 3.295 / 3.296 against 3.463 / 3.456 at batch 2, 6.209 / 6.212 against 6.383 / 6.364 at 4
# (moe_fp8_words_tiles_ab_qwen3_30b_a3b_h100.log). With the float8 cast (decoding off)
# these experts keep DEFAULT_CONFIG.
TUNED_FP8_WORDS: dict[int, SmallMConfig] = {
    2: SmallMConfig(GemvTiles(4, 512, 1), GemvTiles(16, 128, 16)),
    4: SmallMConfig(GemvTiles(8, 512, 8), GemvTiles(16, 128, 4)),
}
# block_fp8_gemv's tiles by batch bucket: the fastest over Qwen3-30B-A3B-FP8's qkv and o
# together in bench_linear.py --fp8-block on an H100 (docs/results/
# linear_fp8_block_gemv_h100.log): 8.2 + 5.7 us at one row against 13.2 + 21.8 for the
# block matmul, 11.7 + 8.3 at two, 15.3 + 12.2 at four (13.7 + 22.6); at eight the block
# matmul wins, hence fp8.BLOCK_GEMV_MAX_M. Kept for the weights decoded as int32 words: in one
# run these tiles came within 0.6 / 0 / 0.3 us of the best pair at 1 / 2 / 4 rows
# (fused_moe_small_m_fp8_block_int_decode_h100.log).
DENSE_FP8_BLOCK_TILES: dict[int, GemvTiles] = {
    1: GemvTiles(8, 2048, 8),
    2: GemvTiles(8, 1024, 8),
    4: GemvTiles(16, 512, 8),
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
# FP8 weights decoded with integer ops (e4m3_decode) rather than Triton's float8 cast.
_DECODE_E4M3 = envs.MINI_SGLANG_FP8_GEMV_INT_DECODE.get()


def tuned_configs(quant: str | None) -> dict[int, SmallMConfig]:
    """The tuned tiles by batch bucket for experts in format `quant` (see default_config),
    for the weights' decoding in force (MINI_SGLANG_FP8_GEMV_INT_DECODE); {} if none."""
    if _DECODE_E4M3 and quant in ("fp8-block", "fp8"):
        return TUNED_FP8_BLOCK_WORDS if quant == "fp8-block" else TUNED_FP8_WORDS
    return _TUNED_BY_QUANT.get(quant, {})


# kernel_choices' table of per-card tiles: kernel_configs/moe_gemv_<card>.json
CARD_TABLE = "moe_gemv"


def card_format(quant: str | None, dtype: torch.dtype) -> str:
    """The experts' format in a CARD_TABLE key: an FP8 format (Fp8Experts.kind) as the
    weights are decoded ("+words": MINI_SGLANG_FP8_GEMV_INT_DECODE), else the dtype of the
    weights and activations ("bf16", "fp16", "fp32")."""
    if quant is not None:
        return quant + ("+words" if _DECODE_E4M3 else "")
    names = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
    return names.get(dtype, str(dtype).removeprefix("torch."))


def card_key(tokens: int, fmt: str, shape: tuple[int, int, int, int]) -> str:
    """The key of a batch's tiles in CARD_TABLE: its bucket, the layer's shape (experts,
    hidden, intermediate per expert, top-k) and the experts' format (card_format), e.g.
    "M1|E128|H2048|I768|k8|bf16" (Qwen3-30B-A3B at one token), "M2|...|fp8-block+words"."""
    experts, hidden, inter, top_k = shape
    bucket = 1 << (tokens - 1).bit_length()
    return f"M{bucket}|E{experts}|H{hidden}|I{inter}|k{top_k}|{fmt}"


def encode_card_config(config: SmallMConfig) -> list[list[int | None]]:
    """A CARD_TABLE value: [gate_up, down], each [block_n, block_k, warps, stages or null]."""
    return [
        [t.block_n, t.block_k, t.num_warps, t.num_stages] for t in (config.gate_up, config.down)
    ]


def _decode_card_config(value: object) -> SmallMConfig | None:
    """encode_card_config's inverse; None for anything else (a stale or hand-edited entry
    is treated as missing, as kernel_choices asks of its readers)."""

    def tiles(v: object) -> GemvTiles | None:
        if not isinstance(v, list) or len(v) != 4:
            return None
        *ints, stages = v
        if not all(isinstance(i, int) and i > 0 for i in ints):
            return None
        if stages is not None and not (isinstance(stages, int) and stages > 0):
            return None
        return GemvTiles(*ints, stages)

    if not isinstance(value, list) or len(value) != 2:
        return None
    gate_up, down = tiles(value[0]), tiles(value[1])
    return SmallMConfig(gate_up, down) if gate_up and down else None


@functools.cache
def _card_config(
    bucket: int, fmt: str, shape: tuple[int, int, int, int], device: torch.device
) -> SmallMConfig | None:
    """This card's shipped or cached tiles for the batch bucket (CARD_TABLE), or None.
    Cached: an eager decode step asks once per MoE layer, and the lookup (key, lock, parse)
    costs a few microseconds; the table does not change under a running process
    (kernel_choices reads it once)."""
    from mini_sglang.layers import kernel_choices

    value = kernel_choices.lookup(
        CARD_TABLE, kernel_choices.device_name(device), card_key(bucket, fmt, shape)
    )
    return None if value is kernel_choices.MISSING else _decode_card_config(value)


def default_config(
    tokens: int,
    quant: str | None,
    shape: tuple[int, int, int, int] | None = None,
    device: torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> SmallMConfig:
    """The tiles fused_experts_gemv launches for a batch of `tokens` tokens (>= 1) when no
    config is given, for experts in format `quant` (None: bf16/fp16; else Fp8Experts.kind)
    of `shape` (experts, hidden, intermediate, top-k) on `device`, activations in `dtype`,
    the first that applies:

    1. tiles forced for the batch's power-of-two bucket (MINI_SGLANG_MOE_GEMV_TILES), in
       place of either kernel's;
    2. on a CUDA device with a shape and dtype, the card's entry for the bucket, shape and
       format (card_format) in CARD_TABLE (kernel_choices: shipped under kernel_configs/,
       or cached), the tiles benchmarks/tune_gemv_in_step.py found fastest inside that
       model's decode step;
    3. the format's tuned entry for the bucket (TUNED and its FP8 tables, swept on one
       model's shapes), else DEFAULT_CONFIG."""
    bucket = 1 << (tokens - 1).bit_length()
    config = None
    if shape is not None and dtype is not None and device is not None and device.type == "cuda":
        config = _card_config(bucket, card_format(quant, dtype), shape, device)
    config = config or tuned_configs(quant).get(bucket, DEFAULT_CONFIG)
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
        w_scale_ptr,
        ids_ptr,
        INTER,
        H,
        stride_xm,
        stride_we,
        stride_wn,
        stride_am,
        stride_wse,
        stride_wsn,
        TOP_K: tl.constexpr,
        FP8: tl.constexpr,
        GROUP_N: tl.constexpr,
        GROUP_K: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        BITS: tl.constexpr,
        X_WORDS: tl.constexpr,
        PDL: tl.constexpr,
    ):
        """act[pair, n] = silu(x[token] . w[e, n]) * (x[token] . w[e, INTER + n]) for the
        program's BLOCK_N columns n, e = ids[pair], token = pair // TOP_K; nothing for
        e < 0. FP8: w holds FP8 values, w_scale [E, 2I] per channel (GROUP_K 0, applied in
        the epilogue) or [E, 2I / GROUP_N, ceil(H / GROUP_K)] per block (BLOCK_N divides
        GROUP_N, so the program's gate rows share one scale row and its up rows another:
        each K tile's x is multiplied by its columns' scales, any BLOCK_K). x is read in its
        own dtype (weight-only dequantization). BITS: the FP8 w as int32 words of four
        weights, decoded with integer ops (e4m3_decode); BLOCK_K and stride_wn count words;
        X_WORDS: x read as int64 words of four bf16 (e4m3_decode.bf16_quads).
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
            if GROUP_K > 0:  # the scale rows of the program's gate and up row blocks
                gate_s = w_s + (pid_n * BLOCK_N // GROUP_N) * stride_wsn
                up_s = w_s + ((pid_n * BLOCK_N + INTER) // GROUP_N) * stride_wsn
            else:
                gate_s = w_s + rn * stride_wsn
                up_s = w_s + (rn + INTER) * stride_wsn
        if BITS:
            # w holds int32 words of four e4m3 weights (e4m3_decode): BLOCK_K and the row
            # stride count words; the per-element terms are summed once after the loop
            terms_g = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
            terms_u = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
            for k0 in range(0, H // 4, BLOCK_K):
                rj = k0 + tl.arange(0, BLOCK_K)
                w_ok = n_ok[:, None] & (rj < H // 4)[None, :]
                if X_WORDS:  # x's bf16 values in the tile's layout (e4m3_decode.bf16_quads)
                    x0, x1, x2, x3 = e4m3_decode.bf16_quads(x_row, rj, H)
                else:
                    x0, x1, x2, x3 = e4m3_decode.strided_quads(x_row, rj, H, rj >= 0)
                sg = e4m3_decode.X_SCALE
                su = e4m3_decode.X_SCALE
                if GROUP_K > 0:  # the four weights of a word share a scale group
                    sg = sg * tl.load(gate_s + 4 * rj // GROUP_K, mask=4 * rj < H, other=0.0)
                    su = su * tl.load(up_s + 4 * rj // GROUP_K, mask=4 * rj < H, other=0.0)
                g = tl.load(gate_rows + rj[None, :], mask=w_ok, other=0)
                u = tl.load(up_rows + rj[None, :], mask=w_ok, other=0)
                xg0, xg1, xg2, xg3 = x0 * sg, x1 * sg, x2 * sg, x3 * sg
                xu0, xu1, xu2, xu3 = x0 * su, x1 * su, x2 * su, x3 * su
                terms_g += e4m3_decode.e4m3_dot_terms(
                    g, xg0[None, :], xg1[None, :], xg2[None, :], xg3[None, :]
                )
                terms_u += e4m3_decode.e4m3_dot_terms(
                    u, xu0[None, :], xu1[None, :], xu2[None, :], xu3[None, :]
                )
            acc_g = tl.sum(terms_g, axis=1) * e4m3_decode.X_SCALE
            acc_u = tl.sum(terms_u, axis=1) * e4m3_decode.X_SCALE
        else:
            acc_g = tl.zeros((BLOCK_N,), dtype=tl.float32)
            acc_u = tl.zeros((BLOCK_N,), dtype=tl.float32)
            for k0 in range(0, H, BLOCK_K):
                rk = k0 + tl.arange(0, BLOCK_K)
                k_ok = rk < H
                w_ok = n_ok[:, None] & k_ok[None, :]
                xk = tl.load(x_row + rk, mask=k_ok, other=0.0).to(tl.float32)
                xg = xk
                xu = xk
                if FP8 and GROUP_K > 0:  # each column's block scale, folded into x
                    xg = xk * tl.load(gate_s + rk // GROUP_K, mask=k_ok, other=0.0)
                    xu = xk * tl.load(up_s + rk // GROUP_K, mask=k_ok, other=0.0)
                g = tl.load(gate_rows + rk[None, :], mask=w_ok, other=0.0).to(tl.float32)
                u = tl.load(up_rows + rk[None, :], mask=w_ok, other=0.0).to(tl.float32)
                acc_g += tl.sum(g * xg[None, :], axis=1)
                acc_u += tl.sum(u * xu[None, :], axis=1)
        if FP8 and GROUP_K == 0:
            acc_g = acc_g * tl.load(gate_s, mask=n_ok, other=0.0)
            acc_u = acc_u * tl.load(up_s, mask=n_ok, other=0.0)
        # rounded to the activation dtype first, as the grouped GEMM's epilogue does
        gate = acc_g.to(act_ptr.dtype.element_ty).to(tl.float32)
        up = acc_u.to(act_ptr.dtype.element_ty).to(tl.float32)
        y = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(act_ptr + pair * stride_am + rn, y.to(act_ptr.dtype.element_ty), mask=n_ok)

    @triton.jit
    def down_kernel(  # noqa: C901  # constexpr specialisations, compiled away
        act_ptr,
        w_ptr,
        out_ptr,
        w_scale_ptr,
        ids_ptr,
        topk_weights_ptr,
        H,
        INTER,
        stride_am,
        stride_we,
        stride_wn,
        stride_om,
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
        DENSE: tl.constexpr,
        BITS: tl.constexpr,
        X_WORDS: tl.constexpr,
        PDL: tl.constexpr,
    ):
        """out[token, n] = sum over the token's pairs p with ids[p] >= 0 of
        topk_weights[p] * (act[p] . w[ids[p], n]) for the program's BLOCK_N columns n,
        accumulated in fp32 and rounded once; with ADD_OUT, out[token, n] += that sum (out
        is then the residual stream, added in fp32 and rounded once, as the dense GEMV's
        residual epilogue). All k experts' tiles are one [TOP_K_POW2, BLOCK_N, BLOCK_K]
        load per K step, so a program has k times a GEMV's bytes in flight. DENSE (TOP_K
        1): one expert of weight 1 for every row, ids and routing weights unread: a plain
        GEMV act @ w[0]^T. FP8: w holds FP8 values, w_scale [E, H] per channel (GROUP_K 0)
        or [E, H / GROUP_N, ceil(INTER / GROUP_K)] per block (BLOCK_N divides GROUP_N; see
        gate_up_kernel); act is read in its own dtype; BITS and X_WORDS as there. PDL:
        launched as a programmatic dependent of gate_up_kernel, once the ids are final (see
        there): the ids, routing weights and first w tiles load before the wait for act."""
        if PDL:
            gdc_launch_dependents()
        pid_n = tl.program_id(0)
        token = tl.program_id(1).to(tl.int64)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = rn < H
        rj = tl.arange(0, TOP_K_POW2)
        pairs = token * TOP_K + rj
        if DENSE:
            expert = tl.zeros((TOP_K_POW2,), dtype=tl.int64)
            kept = rj < 1
            route = tl.full((TOP_K_POW2,), 1.0, dtype=tl.float32)
        else:
            expert = tl.load(ids_ptr + pairs, mask=rj < TOP_K, other=-1)
            # A dropped pair (or a padding slot) reads nothing (its act row was never
            # written) and adds 0; its expert id is clamped so that no pointer leaves the
            # weights.
            kept = expert >= 0
            expert = tl.maximum(expert, 0).to(tl.int64)
            route = tl.load(topk_weights_ptr + pairs, mask=kept, other=0.0).to(tl.float32)
        rows = (
            w_ptr + expert[:, None, None] * stride_we + rn[None, :, None].to(tl.int64) * stride_wn
        )
        rows_ok = kept[:, None, None] & n_ok[None, :, None]
        a_rows = act_ptr + pairs[:, None] * stride_am
        if FP8:
            w_s = w_scale_ptr + expert[:, None] * stride_wse
            if GROUP_K > 0:  # the scale row of the program's row block, per expert
                w_s = w_s + (pid_n * BLOCK_N // GROUP_N) * stride_wsn
            else:
                w_s = w_s + rn[None, :] * stride_wsn
        # w's K tiles are loaded one step ahead (the first one before the wait); the step
        # after the last loads nothing (all masked). With BITS w holds int32 words of four
        # e4m3 weights (e4m3_decode): BLOCK_K and the row stride count words, KW of them.
        KW = INTER // 4 if BITS else INTER
        rk = tl.arange(0, BLOCK_K)
        w_ok = rows_ok & (rk < KW)[None, None, :]
        w = tl.load(rows + rk[None, None, :], mask=w_ok, other=0.0)  # a float: FP8 takes no int
        if PDL:
            gdc_wait()
        acc = tl.zeros((TOP_K_POW2, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, KW, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            if BITS:
                if X_WORDS:  # a dropped pair's act row was never written: zeroed here
                    a0, a1, a2, a3 = e4m3_decode.bf16_quads(a_rows, rk[None, :], INTER)
                    a0 = tl.where(kept[:, None], a0, 0.0)
                    a1 = tl.where(kept[:, None], a1, 0.0)
                    a2 = tl.where(kept[:, None], a2, 0.0)
                    a3 = tl.where(kept[:, None], a3, 0.0)
                else:
                    a0, a1, a2, a3 = e4m3_decode.strided_quads(
                        a_rows, rk[None, :], INTER, kept[:, None]
                    )
                s = e4m3_decode.X_SCALE
                if GROUP_K > 0:  # the four weights of a word share a scale group
                    s_ok = kept[:, None] & (4 * rk < INTER)[None, :]
                    s = s * tl.load(w_s + 4 * rk[None, :] // GROUP_K, mask=s_ok, other=0.0)
                a0, a1, a2, a3 = a0 * s, a1 * s, a2 * s, a3 * s
                terms = e4m3_decode.e4m3_dot_terms(
                    w, a0[:, None, :], a1[:, None, :], a2[:, None, :], a3[:, None, :]
                )
                part = tl.sum(terms, axis=2) * e4m3_decode.X_SCALE
            else:
                k_ok = rk < INTER
                a_ok = kept[:, None] & k_ok[None, :]
                a = tl.load(a_rows + rk[None, :], mask=a_ok, other=0.0).to(tl.float32)
                if FP8 and GROUP_K > 0:  # each column's block scale, folded into act
                    a = a * tl.load(w_s + rk[None, :] // GROUP_K, mask=a_ok, other=0.0)
                part = tl.sum(w.to(tl.float32) * a[:, None, :], axis=2)
            nk = rk + BLOCK_K
            w = tl.load(
                rows + nk[None, None, :], mask=rows_ok & (nk < KW)[None, None, :], other=0.0
            )
            acc += part
        if FP8 and GROUP_K == 0:
            acc = acc * tl.load(w_s, mask=kept[:, None] & n_ok[None, :], other=0.0)
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


def launch_tiles(tiles: GemvTiles, block: tuple[int, int] | None, bits: bool) -> tuple[int, int]:
    """(BLOCK_N, BLOCK_K) as the kernels are launched with `tiles`: with block-wise scales a
    program's rows must share a scale row, so BLOCK_N divides the block's rows; with BITS
    (FP8 weights read as int32 words) BLOCK_K counts words of four weights."""
    block_n = math.gcd(tiles.block_n, block[0]) if block is not None else tiles.block_n
    return block_n, max(1, tiles.block_k // 4) if bits else tiles.block_k


def _output(x: torch.Tensor, cols: int, residual: torch.Tensor | None) -> torch.Tensor:
    """The [rows of x, cols] tensor the down kernel writes: `residual` (x's dtype, rows
    contiguous), which it then adds into, or a new one."""
    if residual is None:
        return torch.empty(x.shape[0], cols, dtype=x.dtype, device=x.device)
    assert residual.shape == (x.shape[0], cols) and residual.dtype == x.dtype
    assert residual.stride(1) == 1
    return residual


def _weight_args(
    w: torch.Tensor,
    tiles: GemvTiles,
    block: tuple[int, int] | None,
    fp8: bool,
    x: torch.Tensor,
) -> dict:
    """The kernels' arguments for the weight w [E, N, K], the tiles and the rows x [M, K]
    the weight multiplies: w's pointer, expert and row strides, BLOCK_N and BLOCK_K
    (launch_tiles), BITS and X_WORDS. With MINI_SGLANG_FP8_GEMV_INT_DECODE an FP8 w is read as
    int32 words of four weights (e4m3_decode) where K allows, the strides and BLOCK_K then
    in words, and a bf16 x with 8-byte aligned rows as int64 words of four."""
    bits = fp8 and _DECODE_E4M3 and w.dtype == torch.float8_e4m3fn and w.shape[2] % 4 == 0
    x_words = bits and x.dtype == torch.bfloat16 and x.stride(0) % 4 == 0 and x.data_ptr() % 8 == 0
    block_n, block_k = launch_tiles(tiles, block, bits)
    if bits:
        w = e4m3_words(w, w.shape[2])
    return dict(
        w_ptr=w,
        stride_we=w.stride(0),
        stride_wn=w.stride(1),
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        BITS=bits,
        X_WORDS=x_words,
    )


def _scale_args(scale: torch.Tensor | None, block: tuple[int, int] | None, w: torch.Tensor) -> dict:
    """The kernels' FP8 arguments for an FP8 weight's `scale` (None: w is not FP8; w, an
    unread placeholder, takes its place) with `block` scales or per channel (None): the
    scale's expert and row strides, FP8, and the block's (GROUP_N, GROUP_K) ((1, 0): per
    channel)."""
    if scale is None:
        return dict(w_scale_ptr=w, stride_wse=0, stride_wsn=0, FP8=False, GROUP_N=1, GROUP_K=0)
    assert scale.stride(-1) == 1
    group_n, group_k = block if block is not None else (1, 0)
    return dict(
        w_scale_ptr=scale,
        stride_wse=scale.stride(0),
        stride_wsn=scale.stride(1) if block is not None else 1,
        FP8=True,
        GROUP_N=group_n,
        GROUP_K=group_k,
    )


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
    nothing. `fp8`: FP8 experts, dequantized by their scales as they are read (x and the
    SiLU-and-mul output stay in x's dtype). `config`: the tiles (default_config if None).
    `residual` ([M, H], x's dtype, rows contiguous): the sum is added into it in the down
    kernel's epilogue and residual is returned. Both kernels launch as programmatic
    dependents where kernels.pdl_enabled(x)."""
    import triton

    from mini_sglang.layers.kernels import pdl_enabled

    tokens, k = topk_ids.shape
    _, two_i, hidden = w13.shape
    inter = two_i // 2
    if tokens == 0:
        return torch.zeros_like(x) if residual is None else residual
    pdl = pdl_enabled(x)
    quant = fp8.kind if fp8 is not None else None
    shape = (w13.shape[0], hidden, inter, k)
    config = config or default_config(tokens, quant, shape, x.device, x.dtype)
    gate_up_kernel, _ = _get_kernels()
    assert w13.stride(2) == 1 and w2.stride(2) == 1
    ids = topk_ids.reshape(-1).contiguous()
    weights = topk_weights.reshape(-1).contiguous()
    x = x.contiguous()
    block = fp8.block if fp8 is not None else None
    act = torch.empty(tokens * k, inter, dtype=x.dtype, device=x.device)
    weight = _weight_args(w13, config.gate_up, block, fp8 is not None, x)
    gate_up_kernel[(triton.cdiv(inter, weight["BLOCK_N"]), tokens * k)](
        x_ptr=x,
        act_ptr=act,
        ids_ptr=ids,
        INTER=inter,
        H=hidden,
        stride_xm=x.stride(0),
        stride_am=act.stride(0),
        TOP_K=k,
        PDL=pdl,
        **weight,
        **_scale_args(fp8.w13_scale if fp8 is not None else None, block, w13),
        **config.gate_up.launch_options(),
        launch_pdl=pdl,
    )
    out = _output(x, hidden, residual)
    scale = fp8.w2_scale if fp8 is not None else None
    _down(act, w2, scale, block, out, residual is not None, config.down, pdl, (ids, weights, k))
    return out


def _down(
    act: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor | None,
    block: tuple[int, int] | None,
    out: torch.Tensor,
    add_out: bool,
    tiles: GemvTiles,
    pdl: bool,
    routing: tuple[torch.Tensor, torch.Tensor, int] | None,
) -> None:
    """down_kernel into out [rows, H] for w [E, H, K] (FP8 with `scale` where given);
    `routing` (ids, weights, k) of the pairs, or None: DENSE, w[0] for every row of act."""
    import triton

    _, down_kernel = _get_kernels()
    ids, weights, k = routing if routing is not None else (act, act, 1)  # unread when DENSE
    tokens, hidden = out.shape
    weight = _weight_args(w, tiles, block, scale is not None, act)
    down_kernel[(triton.cdiv(hidden, weight["BLOCK_N"]), tokens)](
        act_ptr=act,
        out_ptr=out,
        ids_ptr=ids,
        topk_weights_ptr=weights,
        H=hidden,
        INTER=w.shape[2],
        stride_am=act.stride(0),
        stride_om=out.stride(0),
        TOP_K=k,
        TOP_K_POW2=triton.next_power_of_2(k),
        ADD_OUT=add_out,
        **weight,
        DENSE=routing is None,
        PDL=pdl,
        **_scale_args(scale, block, w),
        **tiles.launch_options(),
        launch_pdl=pdl,
    )


def block_fp8_gemv(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    block: tuple[int, int],
    residual: torch.Tensor | None = None,
    tiles: GemvTiles | None = None,
) -> torch.Tensor:
    """x [M, K] @ (w [N, K] float8_e4m3fn, one scale per block of w_scale [ceil(N / bn),
    ceil(K / bk)])^T in x's dtype, for a few rows (decode): the down kernel with one
    expert (DENSE), the scales folded into x as its tiles are read (x unquantized; see
    gate_up_kernel). `tiles`: DENSE_FP8_BLOCK_TILES' for M's power-of-two bucket (above 4:
    4's) if None. With `residual` ([M, N], x's dtype) the product is added into it and
    residual returned. Launched as a programmatic dependent where kernels.pdl_enabled(x)."""
    return _dense_fp8_gemv(x, w, w_scale, block, residual, tiles)


def channel_fp8_gemv(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    residual: torch.Tensor | None = None,
    tiles: GemvTiles | None = None,
) -> torch.Tensor:
    """block_fp8_gemv for w [N, K] float8_e4m3fn with one scale per row, w_scale [N]
    (per-channel FP8, --quantization fp8): the scales apply in the epilogue."""
    return _dense_fp8_gemv(x, w, w_scale, None, residual, tiles)


def _dense_fp8_gemv(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    block: tuple[int, int] | None,
    residual: torch.Tensor | None,
    tiles: GemvTiles | None,
) -> torch.Tensor:
    """The down kernel with one expert (DENSE) for block_fp8_gemv and channel_fp8_gemv."""
    from mini_sglang.layers.kernels import pdl_enabled

    assert w.stride(1) == 1 and w_scale.stride(-1) == 1
    x = x.contiguous()
    out = _output(x, w.shape[0], residual)
    bucket = 1 << (x.shape[0] - 1).bit_length()
    tiles = tiles or DENSE_FP8_BLOCK_TILES.get(bucket, DENSE_FP8_BLOCK_TILES[4])
    pdl = pdl_enabled(x)
    _down(x, w[None], w_scale[None], block, out, residual is not None, tiles, pdl, None)
    return out

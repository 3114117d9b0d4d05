"""e4m3 (FP8) weights decoded with integer ops inside Triton GEMV kernels.

Triton's float8 -> float32 conversion held every FP8 GEMV to about 12 weights per SM and
cycle on an H200 (docs/performance/decode-gemv.md), below the bandwidth an FP8 weight
stream needs at batch 1. Read as int32 words of four weights instead, each byte is moved
into float32's sign, exponent and mantissa fields with a shift and a mask: the value times
2^-120. The kernel scales x by X_SCALE (2^60) and the dot product by X_SCALE again.

Worked example: the word 0x38_40_C0_00 holds, little-endian, weights 0x00 (0.0), 0xC0
(-2.0), 0x40 (2.0) and 0x38 (1.0): element 4j + i is byte i of word j, which
e4m3_word_byte(q, 24 - 8 * i) decodes.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None


def e4m3_words(w: torch.Tensor, k: int) -> torch.Tensor:
    """w [..., K] float8_e4m3fn viewed as int32 words of four weights (K = k a multiple of
    4, rows 4-aligned), for the kernels' integer decoding."""
    if w.dtype != torch.float8_e4m3fn or k % 4 or w.stride(-2) % 4 or w.stride(-1) != 1:
        raise ValueError("integer e4m3 decoding takes a float8_e4m3fn w, K a multiple of 4")
    return w.view(torch.int32)


if triton is not None:
    # The decoding: f32 bits sign | exponent | mantissa of the byte moved into f32's fields
    # as they are, i.e. the value times 2^-120 (e4m3's exponent bias is 7, f32's 127; e4m3
    # subnormals land on f32 subnormals, times the same factor). x is scaled by 2^60 and the
    # dot product by 2^60 again, so neither the products nor the sums come near f32's
    # subnormal range (2^-126).
    E4M3_TO_F32_MASK = tl.constexpr(-0x78100000)  # 0x87F00000: the sign and 7 bits at 26..20
    X_SCALE = tl.constexpr(2.0**60)

    @triton.jit
    def e4m3_word_byte(q, SHIFT: tl.constexpr):
        """Byte 3 - SHIFT / 8 of the int32 words q, e4m3, as float32 times 2^-120: moved to
        the top byte, shifted arithmetically by 4 (the sign fills bits 31..27) and masked."""
        t = q << SHIFT if SHIFT else q
        return ((t >> 4) & E4M3_TO_F32_MASK).to(tl.float32, bitcast=True)

    @triton.jit
    def e4m3_dot_terms(wt, x0, x1, x2, x3):
        """w[.., 4j + i] x_i summed over the four bytes i of each int32 word of wt (element
        4j + i in byte i of word j, little-endian), elementwise, wt broadcast against the
        x_i; times 2^-120 (the decoding's) and whatever scale x carries."""
        t = e4m3_word_byte(wt, 24) * x0 + e4m3_word_byte(wt, 16) * x1
        t += e4m3_word_byte(wt, 8) * x2 + e4m3_word_byte(wt, 0) * x3
        return t

    @triton.jit
    def bf16_quads(v, rj, K):
        """v[4j + i] for the words j in rj, i = 0..3, as four float32 vectors, for a bf16 v
        read as int64 words of four: the same index vector as the weight's int32 words, so
        the loads come in the weight tile's layout (strided loads of v[4j + i] come in a
        layout of their own and go through shared memory to the tile's, every tile)."""
        q = tl.load(v.to(tl.pointer_type(tl.int64)) + rj, mask=rj < K // 4, other=0)
        lo = q.to(tl.int32)
        hi = (q >> 32).to(tl.int32)
        top = tl.full(lo.shape, -65536, tl.int32)  # 0xFFFF0000: a bf16's bits in f32's
        return (
            (lo << 16).to(tl.float32, bitcast=True),
            (lo & top).to(tl.float32, bitcast=True),
            (hi << 16).to(tl.float32, bitcast=True),
            (hi & top).to(tl.float32, bitcast=True),
        )

    @triton.jit
    def strided_quads(ptrs, rj, K, mask):
        """The four float32 parts v_i = v[4j + i] (i = 0..3) of rows v of K elements for the
        words j in rj (any shape broadcasting against ptrs, the rows' pointers), to multiply
        with e4m3_dot_terms' bytes; 0 where masked or past K. Four strided loads: any dtype
        and alignment (bf16_quads reads an aligned bf16 row in fewer, wider loads)."""
        v0 = tl.load(ptrs + 4 * rj, mask=mask & (4 * rj < K), other=0.0).to(tl.float32)
        v1 = tl.load(ptrs + 4 * rj + 1, mask=mask & (4 * rj + 1 < K), other=0.0).to(tl.float32)
        v2 = tl.load(ptrs + 4 * rj + 2, mask=mask & (4 * rj + 2 < K), other=0.0).to(tl.float32)
        v3 = tl.load(ptrs + 4 * rj + 3, mask=mask & (4 * rj + 3 < K), other=0.0).to(tl.float32)
        return v0, v1, v2, v3

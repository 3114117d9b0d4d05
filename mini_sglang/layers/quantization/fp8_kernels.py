"""FP8 (float8_e4m3fn) quantization and the scaled GEMMs that consume it.

Scales are float32 and multiply: value = fp8 * scale. Shapes:
- per-channel weight scale [N] (one per output row; a per-tensor scale is stored the same
  way, repeated), per-token activation scale [M, 1];
- block-wise weight scale [ceil(N / bn), ceil(K / bk)] for blocks (bn, bk), per-token-group
  activation scale [M, ceil(K / bk)] (groups of bk columns), SGLang's
  w8a8_block_fp8_matmul layout (DeepSeek / Qwen3-FP8 checkpoints call it weight_scale_inv).

`fp8_linear` and `block_fp8_linear` compute x @ dequant(W)^T with x quantized dynamically
(per token, or per token group). On CUDA with FP8 tensor cores (sm89+ for the block-wise
Triton kernel, sm90+ for torch._scaled_mm's row-wise scales) they run FP8 GEMMs; elsewhere
(CPU, older GPUs) they dequantize and multiply in float32, with the same quantization of x,
so every path computes the same function up to summation order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mini_sglang.layers import fused_kernels
from mini_sglang.layers.fused_kernels import RowQuant

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
# Smallest amax a scale is derived from: an all-zero row gets a tiny scale, not 0 / 0.
_MIN_AMAX = 1e-10


def _quantize_last_dim(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    amax = t.abs().amax(dim=-1, keepdim=True).float().clamp_min(_MIN_AMAX)
    scale = amax / FP8_MAX
    q = (t.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


if triton is not None:

    @triton.jit
    def _group_quant_kernel(
        x,
        q,
        s,
        K,
        sxm,
        sqm,
        ssm,
        GROUP: tl.constexpr,
        BLOCK: tl.constexpr,
        QMAX: tl.constexpr,
        MIN_AMAX: tl.constexpr,
    ):
        # program (row, g) quantizes x[row, g * GROUP : (g + 1) * GROUP] with one scale,
        # computed as _quantize_last_dim computes it (precise division, so the values match)
        row = tl.program_id(0)
        g = tl.program_id(1)
        offs = tl.arange(0, BLOCK)
        cols = g * GROUP + offs
        mask = (offs < GROUP) & (cols < K)
        v = tl.load(x + row * sxm + cols, mask=mask, other=0.0).to(tl.float32)
        amax = tl.maximum(tl.max(tl.abs(v), axis=0), MIN_AMAX)
        scale = tl.math.div_rn(amax, QMAX)
        out = tl.minimum(tl.maximum(tl.math.div_rn(v, scale), -QMAX), QMAX)
        tl.store(q + row * sqm + cols, out.to(q.dtype.element_ty), mask=mask)
        tl.store(s + row * ssm + g, scale)


def group_quant_triton(
    x: torch.Tensor, group: int, out: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (q [M, K], scale [M, ceil(K / group)]) in one Triton launch, the values
    of _quantize_last_dim per group (per_token_group_quant; group >= K is per token). q is
    FP8 unless `out` (float32, for Triton's interpreter) is given."""
    m, k = x.shape
    group = min(group, k)
    ng = -(-k // group)
    q = out if out is not None else torch.empty((m, k), dtype=FP8_DTYPE, device=x.device)
    s = torch.empty((m, ng), dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(group)
    _group_quant_kernel[(m, ng)](
        x,
        q,
        s,
        k,
        x.stride(0),
        q.stride(0),
        s.stride(0),
        GROUP=group,
        BLOCK=block,
        QMAX=FP8_MAX,
        MIN_AMAX=_MIN_AMAX,
        num_warps=min(16, max(4, block // 1024)),
    )
    return q, s


def triton_fp8_supported(x: torch.Tensor) -> bool:
    """Whether Triton kernels can read and write FP8 (e4m3) next to x: CUDA sm89+."""
    return triton is not None and _cuda_capability(x) >= (8, 9)


def _use_triton_quant(x: torch.Tensor) -> bool:
    return triton_fp8_supported(x) and x.dim() == 2 and x.stride(1) == 1


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (fp8 [N, K], scale [N]): one scale per row (per output channel)."""
    q, scale = _quantize_last_dim(w)
    return q, scale.reshape(-1)


def quantize_tensor(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w -> (fp8 like w, scale []): one scale for the whole tensor."""
    q, scale = _quantize_last_dim(w.reshape(1, -1))
    return q.reshape(w.shape), scale.reshape(())


def per_token_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (fp8 [M, K], scale [M, 1]): dynamic per-token activation quantization
    (one Triton kernel on CUDA, torch elsewhere; the same values)."""
    if _use_triton_quant(x):
        return group_quant_triton(x, x.shape[1])
    return _quantize_last_dim(x)


def per_token_group_quant(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (fp8 [M, K], scale [M, ceil(K / group)]): one scale per token and group of
    `group` consecutive columns (the last group may be short)."""
    if _use_triton_quant(x):
        return group_quant_triton(x, group)
    m, k = x.shape
    pad = -k % group
    xp = F.pad(x, (0, pad)) if pad else x
    q, scale = _quantize_last_dim(xp.reshape(m, -1, group))
    return q.reshape(m, -1)[:, :k].contiguous(), scale.reshape(m, -1)


def _expand_blocks(scale: torch.Tensor, block: tuple[int, int], shape: torch.Size) -> torch.Tensor:
    bn, bk = block
    full = scale.float().repeat_interleave(bn, dim=0).repeat_interleave(bk, dim=1)
    return full[: shape[0], : shape[1]]


def quantize_blocks(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (fp8 [N, K], scale [ceil(N / bn), ceil(K / bk)]): one scale per block."""
    bn, bk = block
    n, k = w.shape
    wp = F.pad(w.float(), (0, -k % bk, 0, -n % bn))
    nb, kb = wp.shape[0] // bn, wp.shape[1] // bk
    tiles = wp.reshape(nb, bn, kb, bk).permute(0, 2, 1, 3).reshape(nb, kb, bn * bk)
    amax = tiles.abs().amax(dim=-1).clamp_min(_MIN_AMAX)
    scale = amax / FP8_MAX
    q = (w.float() / _expand_blocks(scale, block, w.shape)).clamp(-FP8_MAX, FP8_MAX)
    return q.to(FP8_DTYPE), scale


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 q * scale, scale [N] (per row) or [M, 1]."""
    return q.float() * scale.float().reshape(q.shape[0], 1)


def dequantize_blocks(q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """float32 q * scale of q's block (see quantize_blocks)."""
    return q.float() * _expand_blocks(scale, block, q.shape)


def _cuda_capability(t: torch.Tensor) -> tuple[int, int]:
    return torch.cuda.get_device_capability(t.device) if t.is_cuda else (0, 0)


def scaled_mm_supported(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether torch._scaled_mm with row-wise scales serves x @ w^T (sm90+, dims % 16)."""
    return _cuda_capability(x) >= (9, 0) and x.shape[1] % 16 == 0 and w.shape[0] % 16 == 0


def fp8_linear(
    x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [M, K] @ (w [N, K] fp8 * w_scale [N] per row)^T (+ bias), x quantized per token;
    the result has x's dtype."""
    out = fp8_linear_quantized(*per_token_quant(x), w, w_scale, x.dtype)
    return out + bias if bias is not None else out


def fp8_linear_quantized(
    xq: torch.Tensor, xs: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """fp8_linear for an x already quantized per token: xq [M, K] (FP8 values) with scales
    xs [M, 1]; the result in dtype."""
    if scaled_mm_supported(xq, w):
        return torch._scaled_mm(
            xq, w.t(), scale_a=xs, scale_b=w_scale.view(1, -1), out_dtype=torch.bfloat16
        ).to(dtype)
    return F.linear(dequantize_rows(xq, xs), dequantize_rows(w, w_scale)).to(dtype)


def silu_mul_per_token_quant(
    x: torch.Tensor, out: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """per_token_quant(silu(x[:, :d]) * x[:, d:]) in one Triton launch (fused_kernels.
    silu_and_mul with a RowQuant): the values of the activation kernel followed by the
    quantization kernel. out: see group_quant_triton."""
    m, d = x.shape[0], x.shape[1] // 2
    quant = _row_quant(out if out is not None else x.new_empty((m, d), dtype=FP8_DTYPE))
    fused_kernels.silu_and_mul(x, quant=quant)
    return quant.out, quant.scale


def rmsnorm_per_token_quant(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """per_token_quant(RMSNorm(x [+ residual]) * weight) in one Triton launch (fused_kernels.
    rmsnorm with a RowQuant): the same FP8 values and scales as the norm kernel followed by
    the quantization kernel, without the norm's output round trip through memory. residual,
    if given, becomes x + residual in place (as the norm leaves it). out: see
    group_quant_triton."""
    quant = _row_quant(out if out is not None else x.new_empty(x.shape, dtype=FP8_DTYPE))
    fused_kernels.rmsnorm(x, weight, eps, residual, quant=quant)
    return quant.out, quant.scale


def _row_quant(out: torch.Tensor) -> RowQuant:
    """fused_kernels' per-token FP8 output into `out`, with scales as per_token_quant's."""
    scale = torch.empty((out.shape[0], 1), dtype=torch.float32, device=out.device)
    return RowQuant(out, scale, FP8_MAX, _MIN_AMAX)


def block_fp8_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    block: tuple[int, int],
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K] @ (w [N, K] fp8 with block scales w_scale)^T (+ bias), x quantized per token
    and group of block[1] columns; the result has x's dtype."""
    xq, xs = per_token_group_quant(x, block[1])
    if triton_fp8_supported(x):
        out = w8a8_block_matmul(xq, w, xs, w_scale, block, x.dtype)
    else:
        xd = xq.float() * _expand_blocks(xs, (1, block[1]), xq.shape)
        out = F.linear(xd, dequantize_blocks(w, w_scale, block)).to(x.dtype)
    return out + bias if bias is not None else out


if triton is not None:

    @triton.jit
    def _block_matmul_kernel(
        a,
        b,
        c,
        a_s,
        b_s,
        M,
        N,
        K,
        sam,
        sbn,
        scm,
        sasm,
        sbsn,
        GROUP_N: tl.constexpr,
        GROUP_K: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
    ):
        # c[m, n] = sum over k-groups g of (a[m, g] . b[n, g]) * a_s[m, g] * b_s[n // GROUP_N, g];
        # BK == GROUP_K, so one loop step is one scale group; BN divides GROUP_N, so a
        # program's columns share one weight-scale row.
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        m_mask = rm < M
        n_mask = rn < N
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for g in range(0, tl.cdiv(K, BK)):
            k = g * BK + rk
            k_mask = k < K
            at = tl.load(
                a + rm[:, None] * sam + k[None, :],
                mask=m_mask[:, None] & k_mask[None, :],
                other=0.0,
            )
            bt = tl.load(
                b + rn[None, :] * sbn + k[:, None],
                mask=n_mask[None, :] & k_mask[:, None],
                other=0.0,
            )
            sa = tl.load(a_s + rm * sasm + g, mask=m_mask, other=0.0)
            sb = tl.load(b_s + (rn // GROUP_N) * sbsn + g, mask=n_mask, other=0.0)
            acc += tl.dot(at, bt, out_dtype=tl.float32) * sa[:, None] * sb[None, :]
        out_mask = m_mask[:, None] & n_mask[None, :]
        tl.store(c + rm[:, None] * scm + rn[None, :], acc.to(c.dtype.element_ty), mask=out_mask)


def w8a8_block_matmul(
    xq: torch.Tensor,
    w: torch.Tensor,
    xs: torch.Tensor,
    ws: torch.Tensor,
    block: tuple[int, int],
    out_dtype: torch.dtype,
    bm: int | None = None,
) -> torch.Tensor:
    """The Triton block-scaled GEMM: xq [M, K] (scales xs [M, K / bk]) @ w [N, K]^T (scales
    ws [N / bn, K / bk]) -> [M, N] out_dtype. Inputs may be fp8 or (in Triton's interpreter)
    float32 holding fp8 values. bm: rows per program (default from M)."""
    m, k = xq.shape
    n = w.shape[0]
    bn_group, bk = block
    bn = min(bn_group, 128)
    assert bn_group % bn == 0, block
    if bm is None:
        bm = 16 if m <= 16 else 32 if m <= 32 else 64
    out = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    _block_matmul_kernel[grid](
        xq,
        w,
        out,
        xs,
        ws,
        m,
        n,
        k,
        xq.stride(0),
        w.stride(0),
        out.stride(0),
        xs.stride(0),
        ws.stride(0),
        GROUP_N=bn_group,
        GROUP_K=bk,
        BM=bm,
        BN=bn,
        BK=bk,
        num_warps=4,
        num_stages=3,
    )
    return out

"""Linear layers for small batches (decode at batch 1..8) on CUDA.

At batch 1 a linear layer is a memory-bound GEMV; cuBLAS does not always pick a kernel that
streams the weight at full bandwidth for these skinny shapes. `linear` times cuBLAS against
a simple Triton GEMV once per (power-of-two bucket of M, N, K, dtype) — outside CUDA-graph
capture, during the warm-up runs that precede it — and then always uses the faster one. The
timing replays a CUDA graph with the weight cold in L2 (see cuda_time_ms), the conditions of
a decode step; timed hot, a weight that fits in L2 rewards the wrong kernel. Larger M, CPU
and float32 go straight to F.linear.

The GEMV also takes work from the kernels around it: the gated MLP's SiLU-and-multiply in
its epilogue (linear_silu_mul), an RMSNorm of x in its prologue (linear_rmsnorm) and a
residual add in its epilogue (linear_add_). A prologue or epilogue can change which config
is fastest, so the norm and residual variants are timed as themselves.
"""

from __future__ import annotations

import logging
import re

import torch
import torch.nn.functional as F

from mini_sglang.environ import envs
from mini_sglang.layers import kernel_choices
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
except ImportError:
    triton = None

logger = logging.getLogger(__name__)

MAX_M = SMALL_M_MAX_ROWS
_ENABLED = not envs.MINI_SGLANG_DISABLE_SMALL_M_GEMM.get()
_FUSE_SILU_MUL = not envs.MINI_SGLANG_DISABLE_GEMV_SILU_FUSION.get()
FUSE_NORM = not envs.MINI_SGLANG_DISABLE_GEMV_NORM_FUSION.get()
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


def candidates(variant: tuple[str, ...] = ()) -> list[tuple]:
    """The Triton configs the pick times for a fused variant: _CONFIGS, plus the
    tensor-core dot configs for an FP8 weight (with SiLU-mul only those whose half of
    BLOCK_N, a program's gate rows, is still tl.dot's smallest N, 16)."""
    if "fp8" not in variant:
        return list(_CONFIGS)
    dots = [c for c in _FP8_DOT_CONFIGS if "silu_mul" not in variant or c[0] >= 32]
    return _CONFIGS + dots


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
    ):
        # With DOT each K tile is one tl.dot of x [BM >= 16, BK] and the weight tile
        # transposed [BK, BN >= 16], both in x's dtype (fp32 accumulation; IEEE: exact fp32
        # products for float32 x, not TF32); without, an elementwise fp32 multiply and sum.
        # A program computes BN outputs out[:, rn]: x @ w[rn]^T, or with SILU_MUL, where w is
        # [gate; up] (2N rows), silu(x @ w[rn]^T) * (x @ w[N + rn]^T); e.g. N = 14336, BN = 2:
        # program 3 reads gate rows 6, 7 and up rows 14342, 14343, and writes columns 6, 7.
        pid = tl.program_id(0)
        rn = pid * BN + tl.arange(0, BN)
        rm = tl.arange(0, BM)
        rk = tl.arange(0, BK)
        w_rows = w + rn[:, None] * swn
        w_mask = rn[:, None] < N
        # The weight is never written during a step, so its first tile is loaded before the
        # wait: under programmatic dependent launch (PDL) this kernel starts while the one
        # producing x drains, and only the x loads wait (gdc_wait) for that kernel's writes.
        wt = tl.load(w_rows + rk[None, :], mask=w_mask & (rk[None, :] < K), other=0.0)
        if SILU_MUL:
            wu = tl.load(w_rows + N * swn + rk[None, :], mask=w_mask & (rk[None, :] < K), other=0.0)
        if NORM_G:
            gt = tl.load(norm_w + rk, mask=rk < K, other=0.0).to(tl.float32)
        if PDL:
            gdc_launch_dependents()
            gdc_wait()
        x_rows = x + rm[:, None] * sxm
        x_mask = rm[:, None] < M
        xt = tl.load(x_rows + rk[None, :], mask=x_mask & (rk[None, :] < K), other=0.0)
        xt = xt.to(tl.float32)
        if NORM:  # RMSNorm(x) * g = rstd * (x * g): sum x^2 along, scale at the end
            sq = xt * xt  # reduced once after the loop, not per tile
            if NORM_G:
                xt = xt * gt[None, :]
        acc = _tile_product(xt, wt, x, DOT, IEEE)
        if SILU_MUL:
            acc_up = _tile_product(xt, wu, x, DOT, IEEE)
        for k0 in range(BK, K, BK):
            rk = k0 + tl.arange(0, BK)
            k_mask = rk[None, :] < K
            wt = tl.load(w_rows + rk[None, :], mask=w_mask & k_mask, other=0.0)
            xt = tl.load(x_rows + rk[None, :], mask=x_mask & k_mask, other=0.0)
            xt = xt.to(tl.float32)
            if NORM:
                sq += xt * xt
                if NORM_G:
                    gt = tl.load(norm_w + rk, mask=rk < K, other=0.0).to(tl.float32)
                    xt = xt * gt[None, :]
            if SILU_MUL:
                wu = tl.load(w_rows + N * swn + rk[None, :], mask=w_mask & k_mask, other=0.0)
            acc += _tile_product(xt, wt, x, DOT, IEEE)
            if SILU_MUL:
                acc_up += _tile_product(xt, wu, x, DOT, IEEE)
        if W_SCALE:  # a per-row scale of a quantized w (FP8): out = x @ (w * scale)^T
            acc = acc * tl.load(w_scale + rn, mask=rn < N, other=0.0)[None, :]
            if SILU_MUL:
                acc_up = acc_up * tl.load(w_scale + N + rn, mask=rn < N, other=0.0)[None, :]
        if NORM:
            rstd = (1.0 / tl.sqrt(tl.sum(sq, axis=1) / K + eps))[:, None]
            acc = acc * rstd
            if SILU_MUL:
                acc_up = acc_up * rstd
        y = acc.to(out.dtype.element_ty)
        if SILU_MUL:
            # rounded as gemv's output and then fused_kernels.silu_and_mul would round
            y = silu_mul(y.to(tl.float32), acc_up.to(out.dtype.element_ty))
        out_mask = (rm[:, None] < M) & (rn[None, :] < N)
        if ADD_RES:
            # out holds the residual: y + residual, rounded as the add of fused_kernels.rmsnorm
            # rounds; a program reads and writes only its own columns
            r = tl.load(out + rm[:, None] * som + rn[None, :], mask=out_mask, other=0.0)
            y = (y.to(tl.float32) + r.to(tl.float32)).to(out.dtype.element_ty)
        tl.store(out + rm[:, None] * som + rn[None, :], y, mask=out_mask)


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
) -> torch.Tensor:
    """x [M, K] @ w[N, K]^T with the Triton kernel and config (BLOCK_N, BLOCK_K, warps[,
    stages]); without stages Triton's default software pipelining depth is used. pdl=True
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
    """
    m, k = x.shape
    n = w.shape[0]
    bn, bk, warps = cfg[:3]
    extra = {"num_stages": cfg[3]} if len(cfg) > 3 else {}
    dot = len(cfg) > 4 and bool(cfg[4])
    bm = max(1, triton.next_power_of_2(m))
    if dot:
        bm = max(16, bm)  # tl.dot's smallest M; the extra rows are masked off
    elif bm > 1:
        bk = max(32, bk // bm)  # keep the per-thread register tile bounded
    if silu_mul:
        assert n % 2 == 0 and bn >= 2, (n, cfg)
        if dot:  # tl.dot needs 16 gate rows a program: gate_up's pick is timed without SiLU
            bn = max(bn, 32)
        n, bn = n // 2, bn // 2
    assert norm_weight is None or eps is not None, "norm_weight needs eps"
    if residual is not None:
        assert residual.shape == (m, n) and residual.stride(1) == 1, residual.shape
        out = residual
    else:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _gemv_kernel[(triton.cdiv(n, bn),)](
        x,
        w,
        out,
        m,
        n,
        k,
        x.stride(0),
        w.stride(0),
        out.stride(0),
        norm_weight if norm_weight is not None else w,  # unread without NORM_G
        eps or 0.0,
        w_scale if w_scale is not None else w,  # unread without W_SCALE
        BM=bm,
        BN=bn,
        BK=bk,
        PDL=pdl,
        SILU_MUL=silu_mul,
        ADD_RES=residual is not None,
        NORM=eps is not None,
        NORM_G=norm_weight is not None,
        W_SCALE=w_scale is not None,
        DOT=dot,
        IEEE=x.dtype == torch.float32,
        num_warps=warps,
        launch_pdl=pdl,
        **extra,
    )
    return out


def _variant_kwargs(x: torch.Tensor, w: torch.Tensor, variant: tuple[str, ...]) -> dict:
    """gemv's keyword arguments for timing a fused variant: "silu_mul", "norm" (RMSNorm with
    g loaded) and "residual" (added in place) name gemv's options; "fp8" a per-row scaled
    FP8 weight."""
    kwargs: dict = {"silu_mul": "silu_mul" in variant}
    if "fp8" in variant:
        kwargs["w_scale"] = torch.ones(w.shape[0], dtype=torch.float32, device=w.device)
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
    (see _variant_kwargs): a prologue or epilogue can change which config is fastest. An
    FP8 weight ("fp8" variant) has no cuBLAS GEMV: cuBLAS is timed as never faster. For the
    "norm" variant cuBLAS is timed with the RMSNorm kernel the layer runs before it when it
    does not fold the norm: the fold saves that kernel, so leaving it out of cuBLAS's side
    would compare the fold against a path that does not exist."""
    kwargs = _variant_kwargs(x, w, variant)
    if "fp8" in variant:
        times: dict[tuple | None, float] = {None: float("inf")}
    elif "norm" in variant:
        from mini_sglang.layers.layernorm import RMSNorm  # deferred: it imports this module

        norm = RMSNorm(x.shape[1], kwargs["eps"]).to(device=x.device, dtype=x.dtype)
        times = {None: cuda_time_ms(lambda: F.linear(norm(x), w), cold_l2=True)}
    else:
        times = {None: cuda_time_ms(lambda: F.linear(x, w), cold_l2=True)}
    for cfg in candidates(variant):
        try:
            times[cfg] = cuda_time_ms(lambda cfg=cfg: gemv(x, w, cfg, **kwargs), cold_l2=True)
        except Exception:  # a config the compiler rejects on this card
            continue
    return times


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
    best = choose(times, **pick_rule(x))
    logger.debug(
        "small-M GEMM M=%d N=%d K=%d %s: %s (%.1f us; cuBLAS %.1f us)",
        x.shape[0], w.shape[0], w.shape[1], variant, best or "cuBLAS", 1000 * times[best],
        1000 * times[None],
    )  # fmt: skip
    return best


def _config(x: torch.Tensor, w: torch.Tensor, variant: tuple[str, ...] = ()) -> tuple | None:
    """The Triton config to compute x @ w^T with as the fused variant (see _variant_kwargs;
    () is the plain GEMV), or None where F.linear (cuBLAS) serves: CPU, float32, more than
    MAX_M rows, or cuBLAS timed faster."""
    if (
        not _ENABLED
        or triton is None
        or not x.is_cuda
        or x.dim() != 2
        or x.shape[0] > MAX_M
        or x.dtype not in (torch.bfloat16, torch.float16)
        or not x.is_contiguous()
    ):
        return None
    # One pick per power-of-two bucket of M: the kernel pads M to that size anyway (BM), and
    # the CUDA-graph warm-up (batches 1, 2, 4, 8) then covers every bucket, so no pick ever
    # runs mid-serving, e.g. for the LM head of a prefill batch of 3 requests. A pick costs
    # ~0.1 s of graph captures; timing each new M at run time cost 15% of Llama-3.1-8B's
    # nano-vllm throughput.
    bucket = triton.next_power_of_2(x.shape[0])
    key = (bucket, w.shape[0], w.shape[1], x.dtype, variant)
    if key not in _choice:
        if torch.cuda.is_current_stream_capturing():
            return None
        if tuple(w.shape) in _FORCED:
            _choice[key] = _FORCED[tuple(w.shape)]
            logger.debug("small-M GEMM N=%d K=%d %s: %s (forced)", *w.shape, variant, _choice[key])
        else:
            _choice[key] = _stored_or_timed(key, x, w, variant)
    return _choice[key]


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
    best = _pick(x.new_zeros((key[0], x.shape[1])), w, variant)
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


def linear_scaled(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor | None:
    """x @ (w * w_scale[:, None])^T for an FP8 w with per-row scales, through the Triton GEMV
    where _config picks it (the "fp8" variant: CUDA, at most MAX_M rows), else None: the
    caller then runs its FP8 GEMM."""
    cfg = _config(x, w, ("fp8",))
    return None if cfg is None else gemv(x, w, cfg, pdl=pdl_enabled(x), w_scale=w_scale)


def _scaled(variant: tuple[str, ...], w_scale: torch.Tensor | None) -> tuple[str, ...]:
    return variant if w_scale is None else (*variant, "fp8")


def linear_silu_mul(
    x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor | None = None
) -> torch.Tensor | None:
    """silu(x @ gate^T) * (x @ up^T) for w = [gate; up] in one Triton GEMV where linear would
    use the Triton GEMV for x @ w^T, else None: the caller then runs linear and the
    activation itself. At batch 1 this saves the SiLU-mul kernel of every MLP.
    MINI_SGLANG_DISABLE_GEMV_SILU_FUSION=1 always returns None. w_scale: see linear_scaled."""
    cfg = _config(x, w, _scaled((), w_scale)) if _FUSE_SILU_MUL else None
    if cfg is None:
        return None
    return gemv(x, w, cfg, pdl=pdl_enabled(x), silu_mul=True, w_scale=w_scale)


def linear_rmsnorm(
    x: torch.Tensor,
    w: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    w_scale: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """RMSNorm(x) * norm_weight @ w^T in one Triton GEMV (see gemv's norm_weight) where linear
    would use the Triton GEMV, else None and the caller runs the norm itself.
    MINI_SGLANG_DISABLE_GEMV_NORM_FUSION=1 always returns None. w_scale: see linear_scaled."""
    cfg = norm_fusion_config(x, w, _scaled(("norm",), w_scale))
    if cfg is None:
        return None
    return gemv(x, w, cfg, pdl=pdl_enabled(x), norm_weight=norm_weight, eps=eps, w_scale=w_scale)


def linear_add_(
    x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor, w_scale: torch.Tensor | None = None
) -> bool:
    """residual += x @ w^T in place, in the Triton GEMV's epilogue, where linear would use the
    Triton GEMV; returns False (residual untouched) otherwise. w_scale: see linear_scaled."""
    cfg = norm_fusion_config(x, w, _scaled(("residual",), w_scale))
    if cfg is None:
        return False
    gemv(x, w, cfg, pdl=pdl_enabled(x), residual=residual, w_scale=w_scale)
    return True

"""The experts on the GPU: one grouped GEMM per projection over expert-sorted blocks.

fused_experts_triton computes what experts_torch.fused_experts_torch does, in four steps of
one launch each (the alignment's two above 64 pairs) and with no host sync (CUDA-graph safe):

1. moe_align_block_size (align.py) sorts the n = tokens * k (token, slot) pairs by expert
   into blocks of BLOCK_SIZE_M pairs that share one expert;
2. GEMM 1 with SiLU-and-mul in its epilogue: for each block and N tile, the block's token
   rows times its expert's gate tile and up tile (w13 rows j and I + j), then
   silu(gate) * up -> act [n, I] (rows are pair indices; the [n, 2I] product is never
   stored);
3. GEMM 2: act rows times the expert's w2 tile, scaled by the pair's routing weight
   -> [n, H];
4. the sum over each token's k slots -> [tokens, H] (moe_sum).

Padding entries of a block (index n) are masked out of loads and stores; blocks past
num_post_padded exit at once, so the grid can be sized for the worst case on the host.
Tile sizes come from kernel_config.get_config. A few tokens (MINI_SGLANG_MOE_SMALL_M) take
fused_moe_gemv's alignment-free path instead.

FP8 experts (Fp8Experts) run the same steps w8a8: x is quantized before GEMM 1 and the
SiLU-and-mul output before GEMM 2 (per token, or per token and group of bk columns), and
the kernel applies the weight and activation scales in its epilogue (per channel) or at
each K step (block-wise), as SGLang's use_fp8_w8a8 kernel does. Fp8Experts.quantize is
unused on the GEMV path, which reads the activations unquantized.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mini_sglang.layers.moe import fused_moe_gemv
from mini_sglang.layers.moe.align import moe_align_block_size
from mini_sglang.layers.moe.kernel_config import gemm_configs, get_config

_triton_kernel = None
_triton_sum_kernel = None


# FP8 only: K elements an sm90 tensor-core dot (wgmma, 64-row blocks and up) accumulates in
# its reduced-precision accumulator before adding into the fp32 one; None: Triton's default
# (the whole K loop per channel, one K step block-wise; SGLang's kernel runs the same). For
# benchmarks/fp8_moe_accumulation.py: the loss is inside a K step (128 changes nothing) and
# 32 halves it for 2-32% more time (docs/moe.md), so the kernel runs the default.
FP8_PROMOTE_K: int | None = None


def _kernel():  # noqa: C901  # the kernel's constexpr branches count here too
    global _triton_kernel
    if _triton_kernel is None:
        import triton  # deferred: the CPU path never needs it
        import triton.language as tl

        @triton.jit
        def fused_moe_kernel(  # noqa: C901  # its branches are constexpr specialisations
            a_ptr,
            b_ptr,
            c_ptr,
            a_scale_ptr,
            b_scale_ptr,
            topk_weights_ptr,
            sorted_ids_ptr,
            expert_ids_ptr,
            post_pad_ptr,
            N,
            K,
            max_padded,
            num_pairs,
            stride_am,
            stride_be,
            stride_bn,
            stride_cm,
            stride_asm,
            stride_bse,
            stride_bsn,
            A_ROWS_PER_TOKEN: tl.constexpr,
            SILU_MUL: tl.constexpr,
            MUL_ROUTED_WEIGHT: tl.constexpr,
            IEEE: tl.constexpr,
            FP8: tl.constexpr,
            GROUP_N: tl.constexpr,
            GROUP_K: tl.constexpr,
            BLOCK_SIZE_M: tl.constexpr,
            BLOCK_SIZE_N: tl.constexpr,
            BLOCK_SIZE_K: tl.constexpr,
            GROUP_SIZE_M: tl.constexpr,
            PROMOTE_K: tl.constexpr,
        ):
            """C[pair] = A[pair // A_ROWS_PER_TOKEN] @ B[expert(pair)]^T (* weight[pair]).
            A [rows, K] row-major, B [E, N, K] with unit stride along K, C [pairs, N]. With
            SILU_MUL, B is [E, 2N, K] ([gate; up]) and C = silu(A @ gate^T) * (A @ up^T).
            FP8 (w8a8): A and B hold FP8 values, A scaled by a_scale [rows, K / GROUP_K]
            and B by b_scale [E, 2N or N / GROUP_N, K / GROUP_K] (unit stride along K);
            GROUP_K 0 is per channel (a_scale [rows, 1], b_scale [E, 2N or N], applied in
            the epilogue), else block-wise (applied per K step; BLOCK_SIZE_K divides
            GROUP_K)."""
            pid = tl.program_id(0)
            num_pid_m = tl.cdiv(max_padded, BLOCK_SIZE_M)
            num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
            # grouped order: GROUP_SIZE_M row blocks sweep the N tiles together (L2 reuse)
            group = pid // (GROUP_SIZE_M * num_pid_n)
            first_m = group * GROUP_SIZE_M
            group_m = min(num_pid_m - first_m, GROUP_SIZE_M)
            pid_m = first_m + (pid % (GROUP_SIZE_M * num_pid_n)) % group_m
            pid_n = (pid % (GROUP_SIZE_M * num_pid_n)) // group_m
            if pid_m * BLOCK_SIZE_M >= tl.load(post_pad_ptr):
                return
            offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
            pair = tl.load(sorted_ids_ptr + offs_m)
            pair_ok = pair < num_pairs
            expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
            offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
            n_ok = offs_n < N
            offs_k = tl.arange(0, BLOCK_SIZE_K)
            a_row = (pair // A_ROWS_PER_TOKEN).to(tl.int64)
            a_ptrs = a_ptr + a_row[:, None] * stride_am + offs_k[None, :]
            b_ptrs = b_ptr + expert * stride_be + offs_n[None, :].to(tl.int64) * stride_bn
            b_ptrs += offs_k[:, None]
            up_ptrs = b_ptrs + N * stride_bn  # the up rows (SILU_MUL only)
            if FP8:
                a_s_ptrs = a_scale_ptr + a_row * stride_asm
                b_s_ptrs = b_scale_ptr + expert * stride_bse + (offs_n // GROUP_N) * stride_bsn
                up_s_ptrs = (
                    b_scale_ptr + expert * stride_bse + ((offs_n + N) // GROUP_N) * stride_bsn
                )
            acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
            acc_up = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
            for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
                k_ok = offs_k < K - k * BLOCK_SIZE_K
                a = tl.load(a_ptrs, mask=pair_ok[:, None] & k_ok[None, :], other=0.0)
                b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
                if FP8 and GROUP_K > 0:  # this K step's group scales, per row and column
                    g = k * BLOCK_SIZE_K // GROUP_K
                    a_s = tl.load(a_s_ptrs + g, mask=pair_ok, other=0.0)[:, None]
                    b_s = tl.load(b_s_ptrs + g, mask=n_ok, other=0.0)[None, :]
                    if IEEE:
                        acc += tl.dot(a, b, input_precision="ieee") * a_s * b_s
                    else:
                        acc += tl.dot(a, b, max_num_imprecise_acc=PROMOTE_K) * a_s * b_s
                elif IEEE:
                    acc += tl.dot(a, b, input_precision="ieee")
                else:
                    acc += tl.dot(a, b, max_num_imprecise_acc=PROMOTE_K)
                if SILU_MUL:
                    u = tl.load(up_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
                    if FP8 and GROUP_K > 0:
                        u_s = tl.load(up_s_ptrs + g, mask=n_ok, other=0.0)[None, :]
                        if IEEE:
                            acc_up += tl.dot(a, u, input_precision="ieee") * a_s * u_s
                        else:
                            acc_up += tl.dot(a, u, max_num_imprecise_acc=PROMOTE_K) * a_s * u_s
                    elif IEEE:
                        acc_up += tl.dot(a, u, input_precision="ieee")
                    else:
                        acc_up += tl.dot(a, u, max_num_imprecise_acc=PROMOTE_K)
                    up_ptrs += BLOCK_SIZE_K
                a_ptrs += BLOCK_SIZE_K
                b_ptrs += BLOCK_SIZE_K
            if FP8 and GROUP_K == 0:
                a_s = tl.load(a_s_ptrs, mask=pair_ok, other=0.0)[:, None]
                acc = acc * a_s * tl.load(b_s_ptrs, mask=n_ok, other=0.0)[None, :]
                if SILU_MUL:
                    acc_up = acc_up * a_s * tl.load(up_s_ptrs, mask=n_ok, other=0.0)[None, :]
            if SILU_MUL:
                # rounded to the output dtype first, as the unfused GEMM and activation do
                gate = acc.to(c_ptr.dtype.element_ty).to(tl.float32)
                up = acc_up.to(c_ptr.dtype.element_ty).to(tl.float32)
                acc = gate / (1.0 + tl.exp(-gate)) * up
            if MUL_ROUTED_WEIGHT:
                w = tl.load(topk_weights_ptr + pair, mask=pair_ok, other=0.0)
                acc = acc * w[:, None]
            c_ptrs = c_ptr + pair.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
            tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=pair_ok[:, None] & n_ok[None, :])

        _triton_kernel = fused_moe_kernel
    return _triton_kernel


@dataclass(frozen=True)
class Fp8Experts:
    """The FP8 (w8a8) operands of fused_experts_triton: w13 and w2 hold float8_e4m3fn values
    (in Triton's interpreter: float32 tensors holding such values) with float32 scales,
    value = fp8 * scale:

    - per channel (`block` None): w13_scale [E, 2I], w2_scale [E, H]; the activations (x,
      and the SiLU-and-mul output) are quantized per row;
    - block-wise (`block` (bn, bk), bn dividing I): w13_scale [E, 2I / bn, ceil(H / bk)],
      w2_scale [E, ceil(H / bn), ceil(I / bk)]; activations per row and group of bk columns.

    `quantize(t [M, K], group or None) -> (q [M, K], scale [M, 1] or [M, ceil(K / group)])`
    quantizes activations; the caller supplies it (layers/quantization's kernels), as that
    package builds on this one."""

    w13_scale: torch.Tensor
    w2_scale: torch.Tensor
    block: tuple[int, int] | None
    quantize: Callable[[torch.Tensor, int | None], tuple[torch.Tensor, torch.Tensor]]

    @property
    def kind(self) -> str:
        """The experts' format as fused_moe_gemv.default_config names it: "fp8" for
        per-channel scales, "fp8-block" for block-wise ones."""
        return "fp8" if self.block is None else "fp8-block"


def _grouped_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    topk_weights: torch.Tensor,
    align: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    a_rows_per_token: int,
    silu_mul: bool,
    mul_routed_weight: bool,
    config: dict[str, int],
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    block: tuple[int, int] | None = None,
) -> None:
    """One grouped GEMM launch; `scales` (a_scale, b_scale) makes it FP8 w8a8 (see
    Fp8Experts for their layouts, `block` for block-wise scales)."""
    import triton

    sorted_ids, expert_ids, post_pad = align
    N, K = b.shape[1] // (2 if silu_mul else 1), b.shape[2]
    assert b.stride(2) == 1 and a.stride(1) == 1 and c.stride(1) == 1
    a_scale, b_scale = (b, b) if scales is None else scales  # b: an unread placeholder
    assert a_scale.stride(-1) == 1 and b_scale.stride(-1) == 1
    group_n, group_k = block if block is not None else (1, 0)
    if group_k:  # one K step must lie in one scale group
        config = dict(config, BLOCK_SIZE_K=math.gcd(config["BLOCK_SIZE_K"], group_k))
    # tl.dot's smallest K: 16 for 16-bit operands, 32 for FP8 ones (compiled; the interpreter
    # takes any)
    min_k = 32 if scales is not None and a.is_cuda else 16
    assert config["BLOCK_SIZE_K"] >= min_k, (config, block)
    max_padded = sorted_ids.numel()
    grid = (
        triton.cdiv(max_padded, config["BLOCK_SIZE_M"]) * triton.cdiv(N, config["BLOCK_SIZE_N"]),
    )
    _kernel()[grid](
        a,
        b,
        c,
        a_scale,
        b_scale,
        topk_weights,
        sorted_ids,
        expert_ids,
        post_pad,
        N,
        K,
        max_padded,
        topk_weights.numel(),
        a.stride(0),
        b.stride(0),
        b.stride(1),
        c.stride(0),
        a_scale.stride(0),
        b_scale.stride(0),
        b_scale.stride(1),
        A_ROWS_PER_TOKEN=a_rows_per_token,
        SILU_MUL=silu_mul,
        MUL_ROUTED_WEIGHT=mul_routed_weight,
        IEEE=a.dtype == torch.float32,
        FP8=scales is not None,
        GROUP_N=group_n,
        GROUP_K=group_k,
        **config,
        # at most one K step: Triton rejects a larger max_num_imprecise_acc than a dot's K
        PROMOTE_K=None
        if scales is None or FP8_PROMOTE_K is None
        else min(FP8_PROMOTE_K, config["BLOCK_SIZE_K"]),
    )


def _sum_kernel():
    global _triton_sum_kernel
    if _triton_sum_kernel is None:
        import triton
        import triton.language as tl

        @triton.jit
        def moe_sum_kernel(
            src_ptr, out_ptr, H, K: tl.constexpr, BLOCK_H: tl.constexpr, ADD: tl.constexpr
        ):
            """out[t] (+)= sum_j src[t * K + j] over a token's K slots, in fp32 in slot
            order, rounded once to out's dtype; with ADD that rounded sum is added into out,
            as residual.add_(sum) would."""
            t = tl.program_id(0).to(tl.int64)  # t * K * H can pass 2**31 in a long prefill
            offs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
            mask = offs < H
            acc = tl.zeros([BLOCK_H], tl.float32)
            for j in tl.static_range(K):
                acc += tl.load(src_ptr + (t * K + j) * H + offs, mask=mask).to(tl.float32)
            dst = out_ptr + t * H + offs
            total = acc.to(out_ptr.dtype.element_ty)
            if ADD:
                total = (total.to(tl.float32) + tl.load(dst, mask=mask).to(tl.float32)).to(
                    out_ptr.dtype.element_ty
                )
            tl.store(dst, total, mask=mask)

        _triton_sum_kernel = moe_sum_kernel
    return _triton_sum_kernel


def moe_sum(src: torch.Tensor, k: int, residual: torch.Tensor | None = None) -> torch.Tensor:
    """src [tokens * k, H] summed over each token's k rows -> [tokens, H] (added into
    `residual` in place and returned, if given): step 4. Hand-written because torch's
    general reduction over the middle dimension (`src.view(tokens, k, H).sum(1)`) reads at
    about a third of the bandwidth (8.3 us at 256 tokens of Qwen3-30B-A3B on an H100), and
    residual.add_ after it would be a second launch."""
    import triton

    rows, h = src.shape
    out = residual if residual is not None else src.new_empty(rows // k, h)
    assert src.is_contiguous() and out.is_contiguous(), "moe_sum indexes rows as t * H"
    block_h = min(1024, triton.next_power_of_2(h))
    grid = (rows // k, triton.cdiv(h, block_h))
    _sum_kernel()[grid](src, out, h, K=k, BLOCK_H=block_h, ADD=residual is not None, num_warps=4)
    return out


def fused_experts_triton(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    dropped_pairs: bool = False,
    config: dict[str, int] | None = None,
    fp8: Fp8Experts | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """fused_experts_torch's result (see the module for the steps). `dropped_pairs`: some ids
    may be negative (experts of other ranks; their pairs add nothing). `config` overrides the
    tuned / default tile sizes, in a config file entry's form (kernel_config; the tuning
    script and tests use it). With `fp8` the experts are FP8 and both GEMMs run w8a8 (x,
    then the SiLU-and-mul output, quantized dynamically; see Fp8Experts); the result has
    x's dtype. Batches of at most
    fused_moe_gemv.MAX_TOKENS tokens (MINI_SGLANG_MOE_SMALL_M) run fused_moe_gemv's two
    kernels instead (FP8 experts there leave the activations unquantized), unless `config`
    asks for the grouped GEMM's tiles. With `residual`
    ([tokens, H], x's dtype) the result is added into it in place (in that path, in the down
    kernel's epilogue) and residual is returned."""
    tokens, k = topk_ids.shape
    E, two_i, _ = w13.shape
    if tokens == 0:  # nothing to launch (a grid of zero programs is an error)
        return torch.zeros_like(x) if residual is None else residual
    if config is None and fused_moe_gemv.use_small_m(tokens):
        return fused_moe_gemv.fused_experts_gemv(
            x, w13, w2, topk_weights, topk_ids, fp8=fp8, residual=residual
        )
    if config is None:
        dtype = x.dtype if fp8 is None else torch.float8_e4m3fn
        block_shape = None if fp8 is None else fp8.block
        config = get_config(tokens, E, w2.shape[2], k, dtype, x.device, block_shape)
    up_config, down_config = gemm_configs(config)
    align = moe_align_block_size(topk_ids, config["BLOCK_SIZE_M"], E)
    weights = topk_weights.reshape(-1).contiguous()
    x = x.contiguous()
    act = torch.empty(tokens * k, two_i // 2, dtype=x.dtype, device=x.device)
    block = fp8.block if fp8 is not None else None
    group = block[1] if block is not None else None
    a, scales = x, None
    if fp8 is not None:
        a, a_scale = fp8.quantize(x, group)
        scales = (a_scale, fp8.w13_scale)
    _grouped_gemm(a, w13, act, weights, align, k, True, False, up_config, scales, block)
    # Dropped pairs' rows are never written, and the sum below must read them as zero.
    alloc = torch.zeros if dropped_pairs else torch.empty
    down = alloc(tokens * k, w2.shape[1], dtype=x.dtype, device=x.device)
    a = act
    if fp8 is not None:
        a, a_scale = fp8.quantize(act, group)
        scales = (a_scale, fp8.w2_scale)
    _grouped_gemm(a, w2, down, weights, align, 1, False, True, down_config, scales, block)
    return moe_sum(down, k, residual)

"""RMSNorm handed from one Triton GEMV to the next, with no norm kernel between them.

In a decoder layer at batch 1 every add-RMSNorm sits between two GEMVs: o_proj (or down_proj)
produces the update of the residual stream h, and gate_up_proj (or the next layer's qkv_proj)
consumes RMSNorm(h) * g. Since rstd = 1/rms(h) is one number per row,

    (RMSNorm(h) * g) @ w^T = rstd * ((h * g) @ w^T)

so the producer's epilogue, which holds its columns of the new h anyway, writes h * g and
adds its share of each row's sum of squares into a counter; the consumer streams h * g like
any x and scales its dot products by rstd at the end. Unlike normalising inside the consumer
(small_m_gemm.linear_rmsnorm), no consumer program loads g or squares x: in gate_up_proj,
whose 7,168 programs each read all of x, loading g too cost more than the norm kernel it
replaced (docs/benchmarks.md, session 18).

Worked example, one row, hidden 4, g = [1, 2, 1, 2], the producer with 2 programs of 2
columns: the new h = [1, -1, 2, 0]; program 0 writes xs[0:2] = [1, -2] and adds 1 + 1 = 2
into slot 0, program 1 writes xs[2:4] = [2, 0] and adds 4 + 0 = 4 into slot 1; the consumer
sums the slots, 6, so rms = sqrt(6 / 4 + eps), and returns (xs @ w^T) / rms =
(RMSNorm(h) * g) @ w^T.

Rounding differs from the unfused kernels (h * g is rounded to the model dtype instead of
h * rstd); greedy tokens still match HF (tests/gpu/test_gpu_correctness.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mini_sglang.layers import small_m_gemm
from mini_sglang.layers.kernels import pdl_enabled


@dataclass
class PrescaledNorm:
    """RMSNorm(h) * g of a residual stream h [M, K], as xs = h * g (model dtype) and
    sumsq [M, small_m_gemm.SUMSQ_SLOTS] whose rows sum to sum_k h[m, k]^2 in int64 units of
    small_m_gemm.SUMSQ_SCALE, for a GEMV to consume."""

    xs: torch.Tensor
    sumsq: torch.Tensor
    eps: float

    def rstd(self) -> torch.Tensor:
        """1/rms(h) per row, float32 [M, 1]."""
        total = self.sumsq.sum(-1).to(torch.float32)
        mean_sq = total / small_m_gemm.SUMSQ_SCALE / self.xs.shape[1]
        return torch.rsqrt(mean_sq + self.eps)[:, None]

    def project(self, w: torch.Tensor) -> torch.Tensor:
        """(RMSNorm(h) * g) @ w^T in torch, for a consumer without a Triton GEMV."""
        return (F.linear(self.xs, w).float() * self.rstd()).to(self.xs.dtype)


def new_sumsq_rows(count: int, x: torch.Tensor) -> torch.Tensor:
    """Zeroed counters for `count` handoffs of x's rows, [count, M, SUMSQ_SLOTS]: allocated
    (one memset) once per forward, since a memset between two PDL-launched GEMVs would cut
    the programmatic dependency between them."""
    shape = (count, x.shape[0], small_m_gemm.SUMSQ_SLOTS)
    return torch.zeros(shape, dtype=torch.int64, device=x.device)


def linear_add_prescale_(
    x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor, g: torch.Tensor, eps: float,
    sumsq: torch.Tensor,
) -> PrescaledNorm | None:  # fmt: skip
    """residual += x @ w^T in place, in the Triton GEMV's epilogue, which also hands on
    RMSNorm(residual) * g as a PrescaledNorm (sumsq: zeroed counters, see new_sumsq_rows).
    None (residual untouched) where the Triton GEMV does not serve x @ w^T."""
    cfg = small_m_gemm.norm_fusion_config(x, w, ("residual", "prescale_out"))
    if cfg is None:
        return None
    xs = torch.empty_like(residual)
    small_m_gemm.gemv(x, w, cfg, pdl=pdl_enabled(x), residual=residual, prescale_out=(g, xs, sumsq))
    return PrescaledNorm(xs, sumsq, eps)


def linear_prescaled(
    p: PrescaledNorm, w: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor] | None = None
) -> torch.Tensor:
    """(RMSNorm(h) * g) @ w^T from p, then act if given. act must be SiLU-and-multiply (w =
    [gate; up]): the Triton GEMV applies it in its epilogue, as small_m_gemm.linear_silu_mul.
    torch where the Triton GEMV does not serve."""
    fuse_act = act is not None and small_m_gemm.FUSE_SILU_MUL
    variant = ("silu_mul", "rstd_in") if fuse_act else ("rstd_in",)
    cfg = small_m_gemm.norm_fusion_config(p.xs, w, variant)
    if cfg is None:
        y = p.project(w)
    else:
        y = small_m_gemm.gemv(
            p.xs, w, cfg, pdl=pdl_enabled(p.xs), silu_mul=fuse_act, sumsq_in=p.sumsq, eps=p.eps
        )
        if fuse_act:
            return y
    return y if act is None else act(y)

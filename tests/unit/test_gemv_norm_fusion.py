"""The Triton GEMV's norm prologue and residual epilogue (small_m_gemm.gemv with norm_weight
/ residual) against torch: RMSNorm(x) * g @ w^T, with and without the gated activation, and
residual += x @ w^T in place. Without CUDA the kernel runs in Triton's interpreter on CPU
tensors; with CUDA compiled, also in bfloat16."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the first import of triton

pytest.importorskip("triton")

from mini_sglang.layers.layernorm import RMSNorm  # noqa: E402
from mini_sglang.layers.small_m_gemm import gemv  # noqa: E402
from tests.unit.test_triton_attention import DEVICE, DTYPES, _tol  # noqa: E402

# (BLOCK_N, BLOCK_K, warps): two K blocks, so the sum of squares runs across the loop
CFG = (4, 128, 4)


def _inputs(m: int, n: int, k: int, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(m * 1000 + n)
    x = (3 * torch.randn(m, k, generator=gen)).to(DEVICE, dtype)  # not unit RMS
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(DEVICE, dtype)
    g = (1 + 0.2 * torch.randn(k, generator=gen)).to(DEVICE, dtype)
    return x, w, g


def _normed(x: torch.Tensor, g: torch.Tensor, eps: float) -> torch.Tensor:
    norm = RMSNorm(x.shape[1], eps)
    norm.weight.data = g.float().cpu()
    return norm.forward_native(x.float().cpu())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k", [(1, 256), (3, 200)])  # k 200: a masked tail block
def test_gemv_with_rmsnorm_prologue(m, k, dtype):
    x, w, g = _inputs(m, 64, k, dtype)
    out = gemv(x, w, CFG, norm_weight=g, eps=1e-5)
    ref = torch.nn.functional.linear(_normed(x, g, 1e-5), w.float().cpu())
    torch.testing.assert_close(out.float().cpu(), ref, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemv_with_rmsnorm_prologue_and_silu_mul_epilogue(dtype):
    x, w, g = _inputs(2, 2 * 32, 256, dtype)
    out = gemv(x, w, CFG, silu_mul=True, norm_weight=g, eps=1e-6)
    y = torch.nn.functional.linear(_normed(x, g, 1e-6), w.float().cpu())
    ref = torch.nn.functional.silu(y[:, :32]) * y[:, 32:]
    torch.testing.assert_close(out.float().cpu(), ref, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemv_adds_into_the_residual_in_place(dtype):
    x, w, _ = _inputs(3, 72, 256, dtype)  # 72 = 18 blocks of 4 outputs
    residual = torch.randn(3, 72).to(DEVICE, dtype)
    ref = (residual.float() + gemv(x, w, CFG).float()).to(dtype)  # the unfused rounding
    out = gemv(x, w, CFG, residual=residual)
    assert out.data_ptr() == residual.data_ptr()
    assert torch.equal(residual, ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemv_with_rmsnorm_prologue_and_g_in_the_weight(dtype):
    # eps without norm_weight: RMSNorm(x) @ (w * g)^T for a weight whose columns g already scales
    x, w, g = _inputs(3, 64, 200, dtype)
    out = gemv(x, (w * g).to(dtype), CFG, eps=1e-5)
    ref = torch.nn.functional.linear(_normed(x, g, 1e-5), w.float().cpu())
    torch.testing.assert_close(out.float().cpu(), ref, **_tol(dtype))

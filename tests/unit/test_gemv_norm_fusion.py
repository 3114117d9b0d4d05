"""The Triton GEMV's norm prologue and residual epilogue (small_m_gemm.gemv with norm_weight
/ residual) against torch: RMSNorm(x) * g @ w^T, with and without the gated activation, and
residual += x @ w^T in place; and the norm handed from one GEMV to the next
(prescaled_norm: prescale_out / sumsq_in). Without CUDA the kernel runs in Triton's interpreter on CPU
tensors; with CUDA compiled, also in bfloat16."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the first import of triton

pytest.importorskip("triton")

from mini_sglang.layers.layernorm import RMSNorm  # noqa: E402
from mini_sglang.layers.prescaled_norm import PrescaledNorm, new_sumsq_rows  # noqa: E402
from mini_sglang.layers.small_m_gemm import SUMSQ_SCALE, gemv  # noqa: E402
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


# ---- the norm handed from one GEMV to the next (prescaled_norm) -------------------------


def _handoff(m: int, n: int, k: int, dtype: torch.dtype, cfg: tuple = CFG):
    """An o_proj-like producer, residual [m, n] += x [m, k] @ w^T: (the PrescaledNorm, the
    residual after, the residual after the plain residual GEMV, g)."""
    x, w, g = _inputs(m, n, k, dtype)
    g = g[:n]  # the norm's weight is over the producer's outputs
    residual = (2 * torch.randn(m, n, generator=torch.Generator().manual_seed(5))).to(DEVICE, dtype)
    sumsq = new_sumsq_rows(1, residual)[0]
    expected_residual = gemv(x, w, cfg, residual=residual.clone())
    handed = _produce(x, w, residual, g, sumsq, cfg)
    return handed, residual, expected_residual, g


def _produce(x, w, residual, g, sumsq, cfg) -> PrescaledNorm:
    """residual += x @ w^T, handing on RMSNorm(residual) * g."""
    xs = torch.empty_like(residual)
    out = gemv(x, w, cfg, residual=residual, prescale_out=(g, xs, sumsq))
    assert out.data_ptr() == residual.data_ptr()
    return PrescaledNorm(xs, sumsq, 1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n", [(1, 64), (3, 72)])  # 72: a partly masked last block
def test_producer_hands_on_h_times_g_and_the_sum_of_squares(m, n, dtype):
    handed, residual, expected_residual, g = _handoff(m, n, 200, dtype)
    assert torch.equal(residual, expected_residual)  # the residual add as without the handoff
    h = residual.float()
    assert torch.equal(handed.xs, (h * g.float()).to(dtype))
    sumsq = handed.sumsq.sum(-1).double() / SUMSQ_SCALE
    torch.testing.assert_close(sumsq, (h.double() ** 2).sum(1), rtol=1e-6, atol=1e-6)


def test_sum_of_squares_is_exact_in_any_program_order():
    # the worked example of prescaled_norm's docstring: two programs of two columns
    x = torch.eye(4, device=DEVICE)[:1]  # x @ w^T = w[:, 0]
    w = torch.tensor([[1.0, 0, 0, 0], [-1, 0, 0, 0], [2, 0, 0, 0], [0, 0, 0, 0]], device=DEVICE)
    residual = torch.zeros(1, 4, device=DEVICE)
    g = torch.tensor([1.0, 2, 1, 2], device=DEVICE)
    sumsq = new_sumsq_rows(1, residual)[0]
    handed = _produce(x, w, residual, g, sumsq, (2, 32, 4))
    assert handed.xs.tolist() == [[1.0, -2, 2, 0]]
    assert handed.sumsq[0, :3].tolist() == [2 * int(SUMSQ_SCALE), 4 * int(SUMSQ_SCALE), 0]
    assert handed.sumsq.sum().item() == 6 * int(SUMSQ_SCALE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("silu", [False, True])
def test_consumer_finishes_the_norm(silu, dtype):
    # producer then consumer against the unfused kernels' math: RMSNorm(residual) * g @ w2^T
    handed, residual, _, g = _handoff(3, 64, 200, dtype)
    n2 = 2 * 24 if silu else 40
    w2 = (torch.randn(n2, 64, generator=torch.Generator().manual_seed(7)) / 8).to(DEVICE, dtype)
    out = gemv(handed.xs, w2, CFG, silu_mul=silu, sumsq_in=handed.sumsq, eps=handed.eps)
    y = torch.nn.functional.linear(_normed(residual, g, handed.eps), w2.float().cpu())
    ref = torch.nn.functional.silu(y[:, :24]) * y[:, 24:] if silu else y
    # bf16: xs, y and silu(y) are each rounded, products reach ~6 (ulp 0.03 there)
    tol = _tol(dtype) if dtype == torch.float32 else {"atol": 3e-2, "rtol": 2e-2}
    torch.testing.assert_close(out.float().cpu(), ref, **tol)
    # the torch fallback of a consumer without a Triton GEMV computes the same
    torch.testing.assert_close(handed.project(w2).float().cpu(), y, **_tol(dtype))

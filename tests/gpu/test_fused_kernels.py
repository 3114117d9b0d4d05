"""The Triton fused kernels against their torch reference (CUDA only)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("m", [1, 2, 3, 8])
@pytest.mark.parametrize("n,k", [(6144, 1024), (1024, 3072), (4096, 4096), (151936, 1024)])
def test_small_m_gemv_matches_cublas(m, n, k):
    from mini_sglang.layers.small_m_gemm import _CONFIGS, gemv

    torch.manual_seed(0)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    ref = torch.nn.functional.linear(x.float(), w.float())
    for cfg in _CONFIGS:
        out = gemv(x, w, cfg)
        torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


def test_store_kv_matches_index_put():
    from mini_sglang.layers.fused_kernels import store_kv

    k = torch.randn(5, 8, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    loc = torch.tensor([4, 0, 9, 2, 7], device="cuda")
    kb = torch.zeros(10, 8, 128, device="cuda", dtype=torch.bfloat16)
    vb = torch.zeros_like(kb)
    store_kv(k, v, loc, kb, vb)
    assert torch.equal(kb[loc], k) and torch.equal(vb[loc], v)


@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("m,n", [(1, 4096), (3, 1024), (8, 576)])
def test_rmsnorm_matches_reference(m, n, with_residual, pdl):
    from mini_sglang.layers.fused_kernels import rmsnorm
    from mini_sglang.layers.layernorm import RMSNorm

    torch.manual_seed(0)
    norm = RMSNorm(n, 1e-5).to("cuda", torch.bfloat16)
    norm.weight.data.uniform_(0.5, 1.5)
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    res = torch.randn_like(x) if with_residual else None
    if res is None:
        ref = norm.forward_native(x)
        out = rmsnorm(x.clone(), norm.weight, 1e-5, pdl=pdl)
        torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
        return
    ref, ref_res = norm.forward_native(x, res)
    x2, res2 = x.clone(), res.clone()
    out = rmsnorm(x2, norm.weight, 1e-5, res2, pdl=pdl)
    assert out.data_ptr() == x2.data_ptr()  # in place, as flashinfer's fused_add_rmsnorm
    torch.testing.assert_close(res2, ref_res)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("m,d", [(1, 14336), (5, 3072), (8, 1000)])
def test_silu_and_mul_matches_reference(m, d, pdl):
    from mini_sglang.layers.fused_kernels import silu_and_mul

    x = torch.randn(m, 2 * d, device="cuda", dtype=torch.bfloat16)
    ref = torch.nn.functional.silu(x[:, :d]) * x[:, d:]
    torch.testing.assert_close(silu_and_mul(x, pdl=pdl), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("m,n,k", [(1, 2 * 14336, 4096), (3, 2 * 3072, 1024), (8, 2 * 1000, 896)])
def test_gemv_with_silu_mul_epilogue_equals_gemv_then_silu_mul(m, n, k):
    """The gate/up projection's fused form (SiLU-mul in the GEMV's epilogue) rounds as the
    two kernels do, so for every config it must equal them bit for bit."""
    from mini_sglang.layers.fused_kernels import silu_and_mul
    from mini_sglang.layers.small_m_gemm import _CONFIGS, _config, gemv, linear_silu_mul

    torch.manual_seed(0)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05
    checked = 0
    for cfg in _CONFIGS:
        try:
            gemv(x, w, cfg)
        except Exception:  # a config the compiler rejects on this card
            continue
        # any config the unfused GEMV can use must work fused (BLOCK_N / 2 may be 1)
        ref = silu_and_mul(gemv(x, w, (cfg[0] // 2, *cfg[1:])))
        assert torch.equal(gemv(x, w, cfg, silu_mul=True), ref), cfg
        checked += 1
    assert checked
    # the dispatching entry point: fused exactly where the Triton GEMV is picked, else None
    fused = linear_silu_mul(x, w)
    assert (fused is None) == (_config(x, w) is None)
    if fused is not None:
        ref = torch.nn.functional.linear(x, w)
        ref = torch.nn.functional.silu(ref[:, : n // 2]) * ref[:, n // 2 :]
        torch.testing.assert_close(fused, ref, atol=2e-2, rtol=2e-2)


def test_pdl_chain_in_a_cuda_graph_matches_the_chain_without_pdl():
    """Programmatic dependent launch lets a kernel start before the one it reads from has
    finished; with a missing wait the result would differ from the serial run."""
    from mini_sglang.layers.fused_kernels import rmsnorm, silu_and_mul
    from mini_sglang.layers.kernels import pdl_enabled
    from mini_sglang.layers.small_m_gemm import gemv

    x0 = torch.randn(1, 2048, device="cuda", dtype=torch.bfloat16)
    if not pdl_enabled(x0):
        pytest.skip("programmatic dependent launch needs a Hopper or newer GPU")
    torch.manual_seed(0)
    w_up = [torch.randn(8192, 2048, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(6)]
    w_down = [torch.randn(2048, 4096, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(6)]
    ones = torch.ones(2048, device="cuda", dtype=torch.bfloat16)

    def chain(pdl: bool) -> tuple[torch.Tensor, torch.Tensor]:
        res = torch.zeros_like(x0)
        x = x0.clone()
        for up, down in zip(w_up, w_down):
            x = rmsnorm(x, ones, 1e-5, res, pdl=pdl)
            x = gemv(
                silu_and_mul(gemv(x, up, (2, 2048, 8, 3), pdl=pdl), pdl=pdl),
                down,
                (2, 4096, 8, 1),
                pdl=pdl,
            )
        return x, res

    outs = {}
    for pdl in (False, True):
        chain(pdl)  # compile outside the capture
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = chain(pdl)
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        outs[pdl] = tuple(t.clone() for t in out)
    assert torch.equal(outs[True][0], outs[False][0])
    assert torch.equal(outs[True][1], outs[False][1])

"""The one-kernel gated MLP (layers/fused_mlp.py) compiled on the GPU: in bfloat16 against
float32 and against the two GEMVs it replaces, bit for bit the same over repeated launches,
and inside a CUDA graph as a programmatic dependent of a norm kernel, where it draws its
tickets before the PDL wait (as the model runs it)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("m", [1, 3, 8])
def test_fused_mlp_matches_float32_and_the_two_gemvs(m):
    from mini_sglang.layers import fused_mlp
    from tests.unit.test_fused_mlp import mlp_inputs, mlp_reference

    # Qwen3-0.6B's MLP: 3072 = 3 h blocks of 1024
    x, w_gate_up, w_down, residual = mlp_inputs(m, 1024, 3072, torch.bfloat16, "cuda")
    ref = mlp_reference(x, w_gate_up, w_down, residual)
    unfused = residual.clone()
    fused_mlp._unfused(x, w_gate_up, w_down, unfused)
    sync = fused_mlp.new_sync_buffer("cuda")
    for cfg in fused_mlp._CONFIGS:
        outs = []
        for _ in range(3):
            outs.append(residual.clone())
            fused_mlp.fused_mlp_add_(x, w_gate_up, w_down, outs[-1], sync, cfg)
        torch.cuda.synchronize()
        assert not sync.any(), (cfg, sync[:8].tolist())
        assert all(torch.equal(outs[0], o) for o in outs[1:]), cfg
        torch.testing.assert_close(outs[0].float().cpu(), ref, atol=3e-2, rtol=2e-2)
        torch.testing.assert_close(outs[0], unfused, atol=3e-2, rtol=2e-2)


def test_fused_mlp_under_pdl_in_a_cuda_graph_matches_it_without_pdl():
    """A missing wait (on the norm before it, or on h between its own tiles) would make the
    PDL chain differ from the serial one; the tiles' sums do not depend on timing."""
    from mini_sglang.layers import fused_mlp
    from mini_sglang.layers.fused_kernels import rmsnorm
    from mini_sglang.layers.kernels import pdl_enabled
    from tests.unit.test_fused_mlp import mlp_inputs

    x0, _, _, _ = mlp_inputs(1, 2048, 5632, torch.bfloat16, "cuda")
    if not pdl_enabled(x0):
        pytest.skip("programmatic dependent launch needs a Hopper or newer GPU")
    layers = [mlp_inputs(1, 2048, 5632, torch.bfloat16, "cuda")[1:3] for _ in range(4)]
    syncs = [fused_mlp.new_sync_buffer("cuda") for _ in layers]
    ones = torch.ones(2048, device="cuda", dtype=torch.bfloat16)
    cfg = fused_mlp._CONFIGS[0]

    def chain(pdl: bool) -> torch.Tensor:
        res = x0.clone()
        x = torch.zeros_like(x0)
        for (w_gate_up, w_down), sync in zip(layers, syncs):
            x = rmsnorm(x, ones, 1e-5, res, pdl=pdl)  # res += x; x = norm(res)
            fused_mlp.fused_mlp_add_(x, w_gate_up, w_down, res, sync, cfg, pdl, early_ticket=pdl)
        return res

    outs = {}
    for pdl in (False, True):
        chain(pdl)  # compile outside the capture
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = chain(pdl)
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        outs[pdl] = out.clone()
    assert all(not s.any() for s in syncs)
    assert torch.equal(outs[True], outs[False])

"""The one-kernel gated MLP (layers/fused_mlp.py) against torch: residual += down(silu(x @
gate^T) * (x @ up^T)), with partial tiles and partial h blocks, more than one row, and the
sync buffer back at zero after each launch so the next launch on it starts clean. Without
CUDA the kernel runs in Triton's interpreter (programs one after another, so the tickets
come out in program order); tests/gpu/test_gpu_fused_mlp.py runs it compiled, in bfloat16,
under PDL and in a CUDA graph."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the first import of triton

pytest.importorskip("triton")

from mini_sglang.layers import fused_mlp  # noqa: E402
from tests.conftest import fix_triton_interpreter_index  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def mlp_inputs(m: int, hidden: int, inter: int, dtype: torch.dtype, device: str = DEVICE):
    """x, [gate; up], down and a residual, scaled so outputs are O(1)."""
    gen = torch.Generator().manual_seed(m * 7919 + inter)
    x = torch.randn(m, hidden, generator=gen)
    w_gate_up = torch.randn(2 * inter, hidden, generator=gen) / hidden**0.5
    w_down = torch.randn(hidden, inter, generator=gen) / inter**0.5
    residual = torch.randn(m, hidden, generator=gen)
    return tuple(t.to(device, dtype) for t in (x, w_gate_up, w_down, residual))


def mlp_reference(x, w_gate_up, w_down, residual) -> torch.Tensor:
    """The MLP plus the residual in float32 on the CPU."""
    x, w_gate_up, w_down, residual = (t.float().cpu() for t in (x, w_gate_up, w_down, residual))
    gate, up = (x @ w_gate_up.T).chunk(2, dim=-1)
    return residual + (torch.nn.functional.silu(gate) * up) @ w_down.T


# (m, hidden, inter, (BN1, BK1, BN2, HB, warps, split)): inter 200 leaves a partial last h
# block (200 = 3 x 64 + 8) and, with BN2 8 over hidden 60, a partial down tile; m 3 pads to
# BM 4
CASES = [
    (1, 64, 96, (2, 32, 4, 32, 4, 0)),
    (3, 64, 200, (4, 64, 8, 64, 4, 1)),
    (1, 60, 200, (2, 64, 8, 64, 4, 0)),
    (1, 60, 200, (2, 64, 8, 64, 4, 1)),
    (3, 64, 200, (4, 64, 8, 32, 4, 0)),
]


@pytest.mark.parametrize("m,hidden,inter,cfg", CASES)
def test_fused_mlp_adds_the_mlp_into_the_residual(m, hidden, inter, cfg):
    fix_triton_interpreter_index()
    x, w_gate_up, w_down, residual = mlp_inputs(m, hidden, inter, torch.float32)
    ref = mlp_reference(x, w_gate_up, w_down, residual)
    sync = fused_mlp.new_sync_buffer(DEVICE)
    for _ in range(2):  # the second launch finds the sync buffer as the first left it
        out = residual.clone()
        assert fused_mlp.fused_mlp_add_(x, w_gate_up, w_down, out, sync, cfg) is out
        torch.testing.assert_close(out.cpu(), ref, atol=1e-4, rtol=1e-4)
        assert not sync.any(), f"sync buffer not reset: {sync[:8].tolist()}"


def test_fused_mlp_is_not_picked_off_the_gpu():
    x, w_gate_up, w_down, _ = mlp_inputs(1, 64, 96, torch.bfloat16, device="cpu")
    assert fused_mlp.fused_mlp_config(x, w_gate_up, w_down) is None

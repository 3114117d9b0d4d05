"""qk_norm_rope_store (q/k RMSNorm, neox RoPE and the K/V store in one kernel) against the
model's own torch path (RMSNorm.forward_native, the rotary embedding's forward_native), for
one head per program (batches up to MAX_M) and blocks of heads (larger batches), including
blocks that run past the last head and are partly masked.

Without CUDA the kernel runs in Triton's interpreter on CPU tensors in float32; with CUDA
it runs compiled, in float32 and bfloat16.
"""

from __future__ import annotations

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # before the first import of triton

pytest.importorskip("triton")

from mini_sglang.layers.fused_kernels import qk_norm_rope_store  # noqa: E402
from mini_sglang.layers.layernorm import RMSNorm  # noqa: E402
from mini_sglang.layers.rotary_embedding import get_rope  # noqa: E402
from mini_sglang.layers.small_m_gemm import MAX_M  # noqa: E402

DEVICE = torch.device("cuda" if CUDA else "cpu")
DTYPES = [torch.float32, torch.bfloat16] if CUDA else [torch.float32]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("has_norm", [True, False])
# (64, 32, 8): 40 heads, so 16 per program leaves 8 masked heads in the last block.
@pytest.mark.parametrize("head_dim,num_q,num_kv", [(128, 16, 8), (64, 32, 8), (128, 4, 2)])
# Token counts on either side of MAX_M; few, as the interpreter's time grows with the
# number of programs (tokens x head blocks).
@pytest.mark.parametrize("tokens,heads_per_program", [(3, None), (12, None), (3, 2), (3, 16)])
def test_qk_norm_rope_store_matches_torch(
    dtype, has_norm, head_dim, num_q, num_kv, tokens, heads_per_program
):
    from transformers import Qwen3Config

    torch.manual_seed(0)
    cfg = Qwen3Config(head_dim=head_dim, rope_theta=1e6)
    rope = get_rope(cfg, head_dim, 4096).to(DEVICE)
    width = (num_q + 2 * num_kv) * head_dim
    qkv = torch.randn(tokens, width, dtype=dtype).to(DEVICE)
    pos = torch.randint(0, 4096, (tokens,))
    pos[0], pos[-1] = 0, 4095  # the cos/sin cache's first and last rows
    pos = pos.to(DEVICE)
    slots = 2 * tokens + 3
    loc = torch.randperm(slots)[:tokens].to(DEVICE)  # scattered, never slot order
    k_buf = torch.zeros(slots, num_kv, head_dim, dtype=dtype, device=DEVICE)
    v_buf = torch.zeros_like(k_buf)
    qn = RMSNorm(head_dim, 1e-6).to(DEVICE, dtype)
    kn = RMSNorm(head_dim, 1e-6).to(DEVICE, dtype)
    qn.weight.data.uniform_(0.5, 1.5)
    kn.weight.data.uniform_(0.5, 1.5)
    q = qk_norm_rope_store(
        qkv,
        pos,
        rope.cos_sin_cache,
        num_q,
        num_kv,
        head_dim,
        qn.weight if has_norm else None,
        kn.weight if has_norm else None,
        1e-6,
        loc,
        k_buf,
        v_buf,
        heads_per_program=heads_per_program,
    )
    rq, rk, rv = qkv.split([num_q * head_dim, num_kv * head_dim, num_kv * head_dim], -1)
    if has_norm:
        rq = qn.forward_native(rq.reshape(-1, head_dim)).view(tokens, -1)
        rk = kn.forward_native(rk.reshape(-1, head_dim)).view(tokens, -1)
    rq, rk = rope.forward_native(pos, rq, rk)
    tol = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 3e-2}
    torch.testing.assert_close(q, rq, **tol)
    torch.testing.assert_close(k_buf[loc].view(tokens, -1), rk, **tol)
    torch.testing.assert_close(v_buf[loc].view(tokens, -1), rv)
    untouched = torch.ones(slots, dtype=torch.bool, device=DEVICE)
    untouched[loc] = False
    assert not k_buf[untouched].any() and not v_buf[untouched].any()


def test_default_heads_per_program_switches_above_max_m():
    """The parametrisation above covers both defaults only while MAX_M sits between 3 and 12."""
    assert 3 <= MAX_M < 12

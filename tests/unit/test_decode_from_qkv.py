"""decode_from_qkv_fwd (RoPE, q/k norm, K/V store and split-KV decode in one kernel) against
plain torch: RMS-normalised (Qwen3) or raw (Llama) heads rotated with neox RoPE, softmax
attention over the pool's earlier keys plus the new one, and the new K/V in the pool.

Without CUDA the kernel runs in Triton's interpreter on CPU tensors (as in
test_triton_attention.py); with CUDA compiled, also in bfloat16.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the first import of triton

pytest.importorskip("triton")

from mini_sglang.layers.attention.base_attn_backend import QKNormRope  # noqa: E402
from mini_sglang.layers.attention.triton_ops.decode_from_qkv import (  # noqa: E402
    decode_from_qkv_fwd,
)
from tests.unit.test_triton_attention import (  # noqa: E402
    CUDA,
    DEVICE,
    DTYPES,
    KV_HEADS,
    _make_pool,
    _reference,
    _tol,
)

EPS = 1e-6


def _cos_sin(max_pos: int, head_dim: int) -> torch.Tensor:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.arange(max_pos).float()[:, None] * inv_freq[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def _norm_rope(x: torch.Tensor, pos: int, cos_sin: torch.Tensor, w: torch.Tensor | None):
    """x [H, D] float64 -> RMS-normalised (w given) and neox-rotated at pos."""
    if w is not None:
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w.double().cpu()
    cos, sin = cos_sin[pos].double().chunk(2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "group,head_dim,num_splits,page_size,qk_norm",
    [(4, 128, 16, 1, False), (2, 64, 3, 16, True), (20, 32, 8, 1, False), (1, 64, 1, 1, True)],
)
def test_decode_from_qkv_matches_torch(group, head_dim, num_splits, page_size, qk_norm, dtype):
    # seq_len 1: only the new token; 65: the new token opens a split; 130, 513: mid-split
    lens = [1, 2, 65, 130, 513]
    k_buf, v_buf, r2t, rows, slots = _make_pool(lens, page_size, head_dim, dtype, seed=group)
    q_heads = KV_HEADS * group
    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(len(lens), (q_heads + 2 * KV_HEADS) * head_dim, generator=gen)
    qkv = qkv.to(DEVICE, dtype)
    cos_sin = _cos_sin(max(lens) + 1, head_dim).to(DEVICE)
    if qk_norm:
        q_w = (1 + 0.1 * torch.randn(head_dim, generator=gen)).to(DEVICE, dtype)
        k_w = (1 + 0.1 * torch.randn(head_dim, generator=gen)).to(DEVICE, dtype)
    else:
        q_w = k_w = None
    positions = torch.tensor([n - 1 for n in lens], device=DEVICE)
    loc = torch.stack([s[-1] for s in slots]).to(DEVICE)
    k_before, v_before = k_buf.clone(), v_buf.clone()
    o = torch.full((len(lens), q_heads, head_dim), float("nan"), dtype=dtype, device=DEVICE)
    mid_o = torch.empty(len(lens), q_heads, num_splits, head_dim, device=DEVICE)
    mid_lse = torch.empty(len(lens), q_heads, num_splits, device=DEVICE)
    scale = head_dim**-0.5
    decode_from_qkv_fwd(
        qkv, positions, QKNormRope(cos_sin, q_w, k_w, EPS), loc, k_buf, v_buf, o, r2t, rows,
        torch.tensor(lens, device=DEVICE), mid_o, mid_lse, scale,
    )  # fmt: skip

    tol = _tol(dtype)
    q_size, kv_size = q_heads * head_dim, KV_HEADS * head_dim
    for b, n in enumerate(lens):
        row = qkv[b].double().cpu()
        q = _norm_rope(row[:q_size].view(q_heads, head_dim), n - 1, cos_sin.cpu(), q_w)
        k = _norm_rope(row[q_size : q_size + kv_size].view(KV_HEADS, head_dim), n - 1,
                       cos_sin.cpu(), k_w)  # fmt: skip
        v = row[q_size + kv_size :].view(KV_HEADS, head_dim)
        # the new K/V are in the pool at the token's slot; nothing else changed
        slot = int(loc[b])
        torch.testing.assert_close(k_buf[slot].double().cpu(), k, **tol)
        torch.testing.assert_close(v_buf[slot].double().cpu(), v)
        k_before[slot], v_before[slot] = k_buf[slot], v_buf[slot]
        ref = _reference(q[None].to(dtype), k_buf, v_buf, slots[b], torch.tensor([n - 1]), scale)
        torch.testing.assert_close(o[b : b + 1].double().cpu(), ref, **tol)
    assert torch.equal(k_buf, k_before) and torch.equal(v_buf, v_before)


@pytest.mark.skipif(not CUDA, reason="the interpreter has no programmatic dependent launch")
def test_decode_from_qkv_with_pdl_equals_without():
    from mini_sglang.layers.kernels import pdl_enabled

    lens = [300]
    k_buf, v_buf, r2t, rows, slots = _make_pool(lens, 1, 128, torch.bfloat16, seed=0)
    qkv = torch.randn(1, 12 * 128, device=DEVICE, dtype=torch.bfloat16)
    cos_sin = _cos_sin(512, 128).to(DEVICE)
    if not pdl_enabled(qkv):  # both runs would be the plain launch: nothing to compare
        pytest.skip("needs a GPU with programmatic dependent launch (Hopper+)")
    outs = []
    for pdl in (False, True):
        o = torch.empty(1, 8, 128, dtype=torch.bfloat16, device=DEVICE)
        mid = (torch.empty(1, 8, 16, 128, device=DEVICE), torch.empty(1, 8, 16, device=DEVICE))
        decode_from_qkv_fwd(
            qkv, torch.tensor([299], device=DEVICE), QKNormRope(cos_sin),
            slots[0][-1:].to(DEVICE), k_buf, v_buf, o, r2t, rows,
            torch.tensor(lens, device=DEVICE), *mid, 128**-0.5, pdl=pdl,
        )  # fmt: skip
        outs.append(o)
    assert torch.equal(outs[0], outs[1])


def test_backends_route_decode_from_qkv_and_match_the_unfused_path():
    """Through HybridAttnBackend as ModelRunner builds it (Triton for decode batches <= 1):
    a batch of one gets the fused kernel, whose output and new K/V equal RotaryEmbedding +
    the torch_native backend's; a batch of two goes to torch_native, which has no such
    kernel (None: the model then takes the unfused path)."""
    from mini_sglang.layers.attention.hybrid_backend import HybridAttnBackend
    from mini_sglang.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from mini_sglang.layers.attention.triton_backend import TritonAttnBackend
    from mini_sglang.layers.rotary_embedding import RotaryEmbedding
    from mini_sglang.model_executor.forward_batch_info import ForwardMode
    from tests.unit.test_triton_attention import _backend_setup, _forward_batch, _scatter_slots

    runner, r2t_pool, kv_pool, layer = _backend_setup(1, head_dim=64, group=4)
    native = TorchNativeAttnBackend(runner)
    hybrid = HybridAttnBackend(native, native, TritonAttnBackend(runner, 4), 1)
    h, d = layer.tp_q_head_num, layer.head_dim
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    rope = RotaryEmbedding(d, 256, inv_freq, 1.0).to(DEVICE)
    gen = torch.Generator().manual_seed(7)
    lens, rows = [70, 9], [2, 3]
    slots = _scatter_slots(lens, 1, gen)
    k_buf, v_buf = kv_pool.get_kv_buffer(0)
    for row, s in zip(rows, slots):
        r2t_pool.req_to_token[row, : len(s)] = s.to(DEVICE, torch.int32)
        k_buf[s.to(DEVICE)] = torch.randn(len(s), KV_HEADS, d, generator=gen).to(DEVICE)
        v_buf[s.to(DEVICE)] = torch.randn(len(s), KV_HEADS, d, generator=gen).to(DEVICE)

    qkv = torch.randn(1, (h + 2 * KV_HEADS) * d, generator=gen).to(DEVICE)
    args = (ForwardMode.DECODE, rows[:1], lens[:1], slots[0][-1:], r2t_pool, kv_pool)
    fb = _forward_batch(*args, hybrid)
    fb.positions = torch.tensor([lens[0] - 1], device=DEVICE)
    hybrid.init_forward_metadata(fb)
    out = hybrid.forward_decode_from_qkv(
        qkv, fb.positions, QKNormRope(rope.cos_sin_cache), layer, fb
    )
    new_kv = k_buf[slots[0][-1]].clone(), v_buf[slots[0][-1]].clone()

    q, k, v = qkv.split([h * d, KV_HEADS * d, KV_HEADS * d], dim=-1)
    q, k = rope.forward_native(fb.positions, q.clone(), k.clone())
    ref_fb = _forward_batch(*args, native)
    native.init_forward_metadata(ref_fb)
    ref = native.forward(q, k.view(1, KV_HEADS, d), v.reshape(1, KV_HEADS, d), layer, ref_fb)
    assert out is not None and out.shape == (1, h * d)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(new_kv[0], k_buf[slots[0][-1]], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(new_kv[1], v_buf[slots[0][-1]], atol=0, rtol=0)

    two = (ForwardMode.DECODE, rows, lens, torch.stack([s[-1] for s in slots]), r2t_pool, kv_pool)
    fb2 = _forward_batch(*two, hybrid)
    hybrid.init_forward_metadata(fb2)
    qkv2 = torch.randn(2, qkv.shape[1], generator=gen).to(DEVICE)
    assert (
        hybrid.forward_decode_from_qkv(
            qkv2, fb2.positions, QKNormRope(rope.cos_sin_cache), layer, fb2
        )
        is None
    )

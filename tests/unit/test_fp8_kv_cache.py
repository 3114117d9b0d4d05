"""FP8 KV cache (--kv-cache-dtype fp8_e4m3 / fp8_e5m2): the pool's store / dequantize round
trip with per-layer scales, checkpoint scale names, and every kernel that writes or reads
the pool against the torch path on the same FP8 pool.

FP8 with m mantissa bits rounds a normal value x to within u|x|, u = 2^-(m+1) (e4m3: 2^-4,
e5m2: 2^-3); values below the smallest normal are rounded to a multiple of the smallest
subnormal, and beyond the largest finite value they saturate. The kernels run in Triton's
interpreter on CPU (as in test_triton_attention.py), compiled on CUDA.
"""

from __future__ import annotations

import logging
import os

import pytest
import torch

from mini_sglang.layers.kv_quant import (
    dequantize_kv,
    fp8_max,
    gather_kv,
    kv_scale_target,
    load_kv_scale,
    quantize_kv,
    read_scales,
    resolve_kv_cache_dtype,
    triton_supports_kv,
)
from mini_sglang.layers.radix_attention import RadixAttention
from mini_sglang.mem_cache.memory_pool import MHATokenToKVPool

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first import of triton

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
# unit roundoff and smallest subnormal of each format
UNIT = {torch.float8_e4m3fn: 2.0**-4, torch.float8_e5m2: 2.0**-3}
TINY = {torch.float8_e4m3fn: 2.0**-9, torch.float8_e5m2: 2.0**-16}


def _close_to_fp8(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, scale: float):
    """|got - want| within FP8 rounding of want / scale, mapped back by scale."""
    bound = UNIT[dtype] * want.abs() + TINY[dtype] / 2 * scale
    err = (got.double() - want.double()).abs()
    assert bool((err <= bound.double() * (1 + 1e-6)).all()), (err - bound).max()


# ---- dtype, pool, round trip ------------------------------------------------------------
def test_resolve_kv_cache_dtype():
    f32 = torch.float32
    assert resolve_kv_cache_dtype("auto", f32) is f32 and resolve_kv_cache_dtype(None, f32) is f32
    assert resolve_kv_cache_dtype("fp8_e4m3", f32) is torch.float8_e4m3fn
    assert resolve_kv_cache_dtype("fp8_e5m2", f32) is torch.float8_e5m2
    assert resolve_kv_cache_dtype("bf16", f32) is torch.bfloat16
    with pytest.raises(ValueError, match="fp4"):
        resolve_kv_cache_dtype("fp4", f32)


def test_fp8_cell_is_half_of_bf16():
    args = (8, 128, 32)  # Llama-3.1-8B's kv heads, head_dim, layers
    bf16 = MHATokenToKVPool.bytes_per_token(*args, torch.bfloat16)
    for dtype in FP8:
        assert MHATokenToKVPool.bytes_per_token(*args, dtype) * 2 == bf16 == 2 * 8 * 128 * 32 * 2
        pool = MHATokenToKVPool(10, dtype, 2, 16, 3, "cpu")
        assert pool.mem_bytes() == 11 * 2 * 16 * 3 * 2
        assert pool.k_buffer[0].dtype == dtype


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("k_scale,v_scale", [(1.0, 1.0), (0.05, 4.0)])
def test_pool_round_trip_with_scales(dtype, k_scale, v_scale):
    gen = torch.Generator().manual_seed(0)
    pool = MHATokenToKVPool(64, dtype, 2, 16, 2, "cpu")
    k = torch.randn(9, 2, 16, generator=gen) * 3
    v = torch.randn(9, 2, 16, generator=gen) * torch.logspace(-4, 1, 16)  # subnormals too
    loc = torch.randperm(64, generator=gen)[:9] + 1
    pool.set_kv_buffer(1, loc, k, v, k_scale, v_scale)
    k_buf, v_buf = pool.get_kv_buffer(1)
    assert k_buf.dtype == dtype
    got_k = dequantize_kv(gather_kv(k_buf, loc), k_scale, torch.float32)
    got_v = dequantize_kv(gather_kv(v_buf, loc), v_scale, torch.float32)
    _close_to_fp8(got_k, k, dtype, k_scale)
    _close_to_fp8(got_v, v, dtype, v_scale)
    # the stored bytes are quantize_kv's, and no other slot or layer was written
    assert torch.equal(gather_kv(k_buf, loc), quantize_kv(k, k_scale, dtype))
    others = torch.ones(65, dtype=torch.bool)
    others[loc] = False
    assert not k_buf.float()[others].any() and not pool.k_buffer[0].float().any()


@pytest.mark.parametrize("dtype", FP8)
def test_out_of_range_values_saturate(dtype):
    m = fp8_max(dtype)
    x = torch.tensor([[[1e9, -1e9, 3 * m, 0.5]]])
    q = quantize_kv(x, 2.0, dtype)
    assert dequantize_kv(q, 2.0, torch.float32).tolist() == [[[2 * m, -2 * m, 2 * m, 0.5]]]


def test_model_dtype_pool_ignores_scales():
    pool = MHATokenToKVPool(8, torch.float32, 1, 4, 1, "cpu")
    k = torch.randn(2, 1, 4)
    pool.set_kv_buffer(0, torch.tensor([1, 2]), k, -k, 0.5, 8.0)
    assert torch.equal(pool.k_buffer[0][1:3], k) and torch.equal(pool.v_buffer[0][1:3], -k)
    layer = RadixAttention(2, 4, 0.5, 1, 0)
    layer.k_scale, layer.v_scale = 0.5, 8.0
    assert read_scales(layer, torch.float32) == {"k_scale": 1.0, "v_scale": 1.0}
    assert read_scales(layer, torch.float8_e4m3fn) == {"k_scale": 0.5, "v_scale": 8.0}
    assert fp8_max(torch.bfloat16) == 0.0 and fp8_max(torch.float8_e4m3fn) == 448.0


def test_triton_support_by_device():
    cpu = torch.device("cpu")
    assert all(triton_supports_kv(d, cpu) for d in (*FP8, torch.bfloat16))
    assert MHATokenToKVPool(4, torch.float8_e4m3fn, 1, 4, 1, "cpu").triton_ok
    if CUDA:  # e4m3 needs sm89+ (Ada, Hopper); e5m2 and bf16 run everywhere
        cuda = torch.device("cuda")
        new_enough = torch.cuda.get_device_capability() >= (8, 9)
        assert triton_supports_kv(torch.float8_e4m3fn, cuda) == new_enough
        assert triton_supports_kv(torch.float8_e5m2, cuda)


# ---- checkpoint scales ------------------------------------------------------------------
@pytest.mark.parametrize(
    "name,target",
    [
        ("model.layers.3.self_attn.k_scale", ("model.layers.3.self_attn", ("k_scale",))),
        ("model.layers.3.self_attn.attn.v_scale", ("model.layers.3.self_attn", ("v_scale",))),
        ("model.layers.3.self_attn.k_proj.k_scale", ("model.layers.3.self_attn", ("k_scale",))),
        ("model.layers.3.self_attn.v_proj.v_scale", ("model.layers.3.self_attn", ("v_scale",))),
        ("model.layers.3.self_attn.kv_scale", ("model.layers.3.self_attn", ("k_scale", "v_scale"))),
        ("model.layers.3.self_attn.k_proj.weight_scale", None),
        ("model.layers.3.self_attn.k_proj.weight", None),
    ],
)
def test_kv_scale_names(name, target):
    assert kv_scale_target(name) == target


def test_load_kv_scale_sets_the_layers_scales(caplog):
    from torch import nn

    # an earlier in-process server start may have left the root logger above WARNING
    caplog.set_level(logging.WARNING)
    block = nn.Module()
    block.attn = RadixAttention(2, 4, 0.5, 1, 0)
    model = nn.Module()
    model.layers = nn.ModuleList([block])
    attn = block.attn
    assert (attn.k_scale, attn.v_scale) == (1.0, 1.0)  # no checkpoint scale: SGLang's 1.0
    assert load_kv_scale(model, "layers.0.kv_scale", torch.tensor(0.25))
    assert (attn.k_scale, attn.v_scale) == (0.25, 0.25)
    assert load_kv_scale(model, "layers.0.v_proj.v_scale", torch.tensor([2.0]))
    assert (attn.k_scale, attn.v_scale) == (0.25, 2.0)
    assert not load_kv_scale(model, "layers.0.qkv_proj.weight", torch.zeros(2))
    assert load_kv_scale(model, "layers.7.k_scale", torch.tensor(3.0))  # not on this model
    assert "layers.7.k_scale" in caplog.text
    with pytest.raises(ValueError, match="per-tensor"):
        load_kv_scale(model, "layers.0.k_scale", torch.ones(2))


# ---- kernels on an FP8 pool ------------------------------------------------------------
# Powers of two, so x / scale of an FP8-representable x * scale is exact. Triton's
# interpreter (the CPU runs) drops the carry when rounding crosses a power of two (1.96 * 64
# becomes 64 in e5m2), so kernel stores are fed values that need no rounding (_exact); the
# rounding itself is torch's (tested above) or the GPU's conversion instruction.
K_SCALE, V_SCALE = 0.5, 0.125


def _exact(shape, dtype, scale: float, gen: torch.Generator) -> torch.Tensor:
    """Random float32 values x whose x / scale are FP8 `dtype` values (no rounding)."""
    return quantize_kv(torch.randn(*shape, generator=gen) * 4, 1.0, dtype).float() * scale


def _fp8_backend_setup(dtype, head_dim=32, group=2):
    """test_triton_attention's backend set-up with an FP8 pool and scaled layer."""
    pytest.importorskip("triton")
    from tests.unit.test_triton_attention import KV_HEADS, _backend_setup

    runner, r2t_pool, _, layer = _backend_setup(1, head_dim=head_dim, group=group)
    kv_pool = MHATokenToKVPool(400, dtype, KV_HEADS, head_dim, 1, r2t_pool.device)
    layer.k_scale, layer.v_scale = K_SCALE, V_SCALE
    return runner, r2t_pool, kv_pool, layer


@pytest.mark.parametrize("dtype", FP8)
def test_triton_backend_on_fp8_pool_matches_torch_native(dtype):
    """Extend on a cached prefix, then a decode step, on one FP8 pool with k/v scales: the
    Triton backend's outputs equal torch_native's (which dequantizes explicitly), and the new
    tokens' K/V are stored quantized."""
    from mini_sglang.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from mini_sglang.layers.attention.triton_backend import TritonAttnBackend
    from mini_sglang.model_executor.forward_batch_info import ForwardMode
    from tests.unit.test_triton_attention import KV_HEADS, _forward_batch, _scatter_slots

    runner, r2t_pool, kv_pool, layer = _fp8_backend_setup(dtype)
    device = r2t_pool.device
    triton_be, native_be = TritonAttnBackend(runner, 4), TorchNativeAttnBackend(runner)
    gen = torch.Generator().manual_seed(3)
    rows = [4, 1]
    lens = [7, 26]  # 6 and 4 new tokens, then one decode token each
    slots = _scatter_slots(lens, 1, gen)
    for row, s in zip(rows, slots):
        r2t_pool.req_to_token[row, : len(s)] = s.to(device, torch.int32)
    h, d = layer.tp_q_head_num, layer.head_dim
    cached_k = _exact((21, KV_HEADS, d), dtype, K_SCALE, gen).to(device)
    cached_v = _exact((21, KV_HEADS, d), dtype, V_SCALE, gen).to(device)
    kv_pool.set_kv_buffer(0, slots[1][:21].to(device), cached_k, cached_v, K_SCALE, V_SCALE)
    k_buf, v_buf = kv_pool.get_kv_buffer(0)
    steps = [
        (ForwardMode.EXTEND, [6, 25], torch.cat([slots[0][:6], slots[1][21:25]]), [6, 4]),
        (ForwardMode.DECODE, lens, torch.stack([slots[0][6], slots[1][25]]), None),
    ]
    for mode, seq_lens, out_loc, ext in steps:
        n = len(out_loc)
        q = torch.randn(n, h * d, generator=gen).to(device)
        k = _exact((n, KV_HEADS, d), dtype, K_SCALE, gen).to(device)
        v = _exact((n, KV_HEADS, d), dtype, V_SCALE, gen).to(device)
        outs = []
        for be in (triton_be, native_be):
            fb = _forward_batch(mode, rows, seq_lens, out_loc, r2t_pool, kv_pool, be, ext)
            be.init_forward_metadata(fb)
            outs.append(be.forward(q, k, v, layer, fb))
            stored = gather_kv(k_buf, out_loc.to(device)).float()
            assert torch.equal(stored, quantize_kv(k, K_SCALE, dtype).float())
            stored = gather_kv(v_buf, out_loc.to(device)).float()
            assert torch.equal(stored, quantize_kv(v, V_SCALE, dtype).float())
        torch.testing.assert_close(outs[0], outs[1], atol=1e-4, rtol=1e-4)
    # torch_native itself: attention over the dequantized pool, i.e. the same pool in float32
    ref_pool = MHATokenToKVPool(400, torch.float32, KV_HEADS, d, 1, device)
    ref_pool.k_buffer[0] = dequantize_kv(k_buf, K_SCALE, torch.float32)
    ref_pool.v_buffer[0] = dequantize_kv(v_buf, V_SCALE, torch.float32)
    fb = _forward_batch(ForwardMode.DECODE, rows, lens, steps[1][2], r2t_pool, ref_pool, native_be)
    native_be.init_forward_metadata(fb)
    ref = native_be.forward(q, None, None, layer, fb, save_kv_cache=False)
    torch.testing.assert_close(outs[1], ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", FP8)
def test_decode_from_qkv_on_fp8_pool_matches_unfused_path(dtype):
    """The fused RoPE + store + decode kernel on an FP8 pool with scales against RoPE +
    torch_native on a copy of the same pool: same output, same stored K/V."""
    from mini_sglang.layers.attention.base_attn_backend import QKNormRope
    from mini_sglang.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from mini_sglang.layers.attention.triton_backend import TritonAttnBackend
    from mini_sglang.layers.rotary_embedding import RotaryEmbedding
    from mini_sglang.model_executor.forward_batch_info import ForwardMode
    from tests.unit.test_triton_attention import KV_HEADS, _forward_batch, _scatter_slots

    runner, r2t_pool, kv_pool, layer = _fp8_backend_setup(dtype, head_dim=64, group=4)
    device = r2t_pool.device
    ref_pool = MHATokenToKVPool(400, dtype, KV_HEADS, 64, 1, device)
    h, d = layer.tp_q_head_num, layer.head_dim
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    rope = RotaryEmbedding(d, 256, inv_freq, 1.0).to(device)
    gen = torch.Generator().manual_seed(7)
    lens, rows = [70], [2]
    slots = _scatter_slots(lens, 1, gen)[0]
    r2t_pool.req_to_token[2, :70] = slots.to(device, torch.int32)
    kv = torch.randn(69, KV_HEADS, d, generator=gen).to(device)
    for pool in (kv_pool, ref_pool):
        pool.set_kv_buffer(0, slots[:69].to(device), kv, -kv, K_SCALE, V_SCALE)

    q = torch.randn(1, h * d, generator=gen)
    k_new, v_new = (
        _exact((1, KV_HEADS * d), dtype, K_SCALE, gen),
        _exact((1, KV_HEADS * d), dtype, V_SCALE, gen),
    )
    qkv = torch.cat([q, k_new, v_new], 1).to(device)
    new = slots[-1:]
    be = TritonAttnBackend(runner, 4)
    fb = _forward_batch(ForwardMode.DECODE, rows, lens, new, r2t_pool, kv_pool, be)
    # RoPE at position 0 is the identity, so the new k reaches the store unrounded (_exact)
    fb.positions = torch.tensor([0], device=device)
    be.init_forward_metadata(fb)
    out = be.forward_decode_from_qkv(qkv, fb.positions, QKNormRope(rope.cos_sin_cache), layer, fb)

    native = TorchNativeAttnBackend(runner)
    q, k, v = qkv.split([h * d, KV_HEADS * d, KV_HEADS * d], dim=-1)
    q, k = rope.forward_native(fb.positions, q.clone(), k.clone())
    ref_fb = _forward_batch(ForwardMode.DECODE, rows, lens, new, r2t_pool, ref_pool, native)
    native.init_forward_metadata(ref_fb)
    ref = native.forward(q, k.view(1, KV_HEADS, d), v.reshape(1, KV_HEADS, d), layer, ref_fb)
    assert out is not None
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    for got, want in zip(kv_pool.get_kv_buffer(0), ref_pool.get_kv_buffer(0)):
        assert torch.equal(got.float(), want.float())


@pytest.mark.parametrize("dtype", FP8)
def test_fused_stores_quantize_as_the_pool(dtype):
    """store_kv and qk_norm_rope_store (the Triton K/V writers) store what quantize_kv does."""
    pytest.importorskip("triton")
    from mini_sglang.layers.fused_kernels import qk_norm_rope_store, store_kv

    device = torch.device("cuda" if CUDA else "cpu")
    gen = torch.Generator().manual_seed(1)
    k = _exact((5, 2, 64), dtype, K_SCALE, gen)
    k[0, 0, :4] = torch.tensor([1e5, -1e5, 1e6, -1e6])  # saturate, in both formats
    k = k.to(device)
    v = _exact((5, 2, 64), dtype, V_SCALE, gen).to(device)
    loc = torch.tensor([3, 9, 1, 7, 4], device=device)
    k_buf = torch.zeros(10, 2, 64, dtype=dtype, device=device)
    v_buf = torch.zeros_like(k_buf)
    store_kv(k, v, loc, k_buf, v_buf, K_SCALE, V_SCALE)
    assert torch.equal(gather_kv(k_buf, loc).float(), quantize_kv(k, K_SCALE, dtype).float())
    assert torch.equal(gather_kv(v_buf, loc).float(), quantize_kv(v, V_SCALE, dtype).float())

    # no norm, position 0: RoPE is the identity, so the stored K/V are qkv's k and v quantized
    qkv = torch.cat(
        [torch.randn(5, 4 * 64, generator=gen).to(device), k.view(5, -1), v.view(5, -1)], 1
    )
    cos_sin = torch.cat([torch.ones(1, 32), torch.zeros(1, 32)], 1).to(device)
    k_buf.zero_(), v_buf.zero_()
    zeros = torch.zeros(5, dtype=torch.int64, device=device)
    q = qk_norm_rope_store(qkv, zeros, cos_sin, 4, 2, 64, None, None, 0.0, loc, k_buf, v_buf,
                           k_scale=K_SCALE, v_scale=V_SCALE)  # fmt: skip
    assert torch.equal(q, qkv[:, : 4 * 64])
    assert torch.equal(gather_kv(k_buf, loc).float(), quantize_kv(k, K_SCALE, dtype).float())
    assert torch.equal(gather_kv(v_buf, loc).float(), quantize_kv(v, V_SCALE, dtype).float())


# ---- flashinfer's XQA decode --------------------------------------------------------------
def test_xqa_decode_policy(monkeypatch):
    """XQA decodes (unless MINI_SGLANG_XQA_DECODE=0) over an e4m3 pool with XQA's page
    sizes, bf16/fp16 queries and a head_dim it compiles, on sm90 or newer."""
    from mini_sglang.layers.attention import flashinfer_backend as fb

    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    args = (torch.bfloat16, torch.float8_e4m3fn, 16, 128, cuda)
    monkeypatch.setenv("MINI_SGLANG_XQA_DECODE", "0")
    assert not fb.xqa_decode_ok(*args)
    monkeypatch.delenv("MINI_SGLANG_XQA_DECODE")
    assert fb.xqa_decode_ok(*args)
    assert fb.xqa_decode_ok(torch.float16, torch.float8_e4m3fn, 128, 64, cuda)
    assert not fb.xqa_decode_ok(torch.bfloat16, torch.float8_e4m3fn, 1, 128, cuda)  # page 1
    assert not fb.xqa_decode_ok(torch.bfloat16, torch.float8_e5m2, 16, 128, cuda)
    assert not fb.xqa_decode_ok(torch.bfloat16, torch.bfloat16, 16, 128, cuda)
    assert not fb.xqa_decode_ok(torch.float32, torch.float8_e4m3fn, 16, 128, cuda)
    assert not fb.xqa_decode_ok(torch.bfloat16, torch.float8_e4m3fn, 16, 72, cuda)
    assert not fb.xqa_decode_ok(*args[:4], torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))
    assert not fb.xqa_decode_ok(*args)


def test_block_table_lists_each_requests_pages():
    """block_table: the docstring's example, then shuffled pages of three requests of
    different lengths, written into the leading rows of a larger buffer."""
    from mini_sglang.layers.attention.flashinfer_backend import block_table

    r2t = torch.zeros(4, 64, dtype=torch.int32)
    r2t[1, :21] = torch.arange(160, 181, dtype=torch.int32)
    out = torch.full((8, 4), -1, dtype=torch.int32)
    got = block_table(r2t, torch.tensor([1]), 16, out)
    assert got.tolist() == [[10, 11, 0, 0]] and out[1:].eq(-1).all()
    gen = torch.Generator().manual_seed(0)
    page, lens, rows = 4, [9, 16, 3], torch.tensor([3, 0, 2])
    pages = (torch.randperm(20, generator=gen) + 1).tolist()
    want = []
    for row, n in zip(rows.tolist(), lens):
        mine = [pages.pop() for _ in range(-(-n // page))]
        want.append(mine)
        slots = [mine[t // page] * page + t % page for t in range(n)]  # token t's slot
        r2t[row, :n] = torch.tensor(slots, dtype=torch.int32)
    out = torch.zeros(6, 16, dtype=torch.int32)
    got = block_table(r2t, rows, page, out)
    assert got.shape == (3, 16)
    assert [got[i, : len(w)].tolist() for i, w in enumerate(want)] == want
    # only the pages the longest request (16 tokens: 4 pages) fills, the rest untouched
    out = torch.full((6, 16), -1, dtype=torch.int32)
    got = block_table(r2t, rows, page, out, max_len=16)
    assert got.shape == (3, 4) and out[:, 4:].eq(-1).all()
    assert [got[i, : len(w)].tolist() for i, w in enumerate(want)] == want
    assert block_table(r2t, rows, page, out, max_len=17).shape == (3, 5)

"""FP8 quantization and scaled GEMMs (layers/quantization/fp8_kernels.py, and the FP8
variant of small_m_gemm's GEMV) against float references, with exact shapes and scales.

Error bounds come from float8_e4m3fn's precision: 3 mantissa bits, so rounding a value v
(in units of its scale) costs at most |v| * 2^-4, or 2^-10 below the smallest normal (2^-6).
Without CUDA the Triton kernels run in Triton's interpreter on float32 tensors that hold
FP8 values (the kernels only load, convert and multiply)."""

from __future__ import annotations

import json
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the first import of triton

from mini_sglang.layers.quantization.fp8 import is_layer_ignored  # noqa: E402
from mini_sglang.layers.quantization.fp8_kernels import (  # noqa: E402
    FP8_MAX,
    block_fp8_linear,
    dequantize_blocks,
    dequantize_rows,
    fp8_linear,
    per_token_group_quant,
    per_token_quant,
    quantize_blocks,
    quantize_rows,
    quantize_tensor,
)
from mini_sglang.layers.quantization.methods import (  # noqa: E402
    SUPPORTED_METHODS,
    QuantSpec,
    parse_quantization,
)
from mini_sglang.layers.quantization.registry import QUANTIZATION_METHODS  # noqa: E402
from mini_sglang.server_args_validation import SUPPORTED_QUANTIZATION  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _rand(*shape: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen) * torch.rand(shape[0], 1, generator=gen) * 4


def _bound(t: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The largest rounding error FP8 allows for values t stored with scale (broadcast)."""
    return t.abs() * 2**-4 + scale * 2**-10


def test_quantize_rows_scales_and_round_trip():
    w = _rand(48, 80)
    q, s = quantize_rows(w)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (48, 80) and s.shape == (48,)
    torch.testing.assert_close(s, w.abs().amax(dim=1) / FP8_MAX, rtol=0, atol=0)
    # each row's largest value is stored exactly as +-448
    assert (q.float().abs().amax(dim=1) == FP8_MAX).all()
    err = (dequantize_rows(q, s) - w).abs()
    assert (err <= _bound(w, s[:, None])).all()


def test_quantize_tensor_and_per_token():
    w = _rand(16, 32)
    q, s = quantize_tensor(w)
    assert s.shape == () and s.item() == pytest.approx(w.abs().max().item() / FP8_MAX, rel=1e-6)
    assert ((q.float() * s - w).abs() <= _bound(w, s)).all()
    xq, xs = per_token_quant(w)
    assert xs.shape == (16, 1)
    torch.testing.assert_close(xs[:, 0], quantize_rows(w)[1], rtol=0, atol=0)


def test_per_token_group_quant_with_a_short_last_group():
    x = _rand(3, 100)  # groups of 32: 32, 32, 32, 4
    q, s = per_token_group_quant(x, 32)
    assert q.shape == (3, 100) and s.shape == (3, 4)
    for g in range(4):
        cols = slice(32 * g, min(32 * g + 32, 100))
        torch.testing.assert_close(s[:, g], x[:, cols].abs().amax(dim=1) / FP8_MAX, rtol=0, atol=0)
        err = (q[:, cols].float() * s[:, g : g + 1] - x[:, cols]).abs()
        assert (err <= _bound(x[:, cols], s[:, g : g + 1])).all()


def test_quantize_blocks_128_scales_and_round_trip():
    w = _rand(300, 200)  # 3 x 2 blocks of 128, the last ones partial
    q, s = quantize_blocks(w, (128, 128))
    assert q.shape == (300, 200) and s.shape == (3, 2)
    for i in range(3):
        for j in range(2):
            tile = w[128 * i : 128 * (i + 1), 128 * j : 128 * (j + 1)]
            assert s[i, j].item() == pytest.approx(tile.abs().max().item() / FP8_MAX, rel=1e-6)
    full = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:300, :200]
    assert ((dequantize_blocks(q, s, (128, 128)) - w).abs() <= _bound(w, full)).all()


def _gemm_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """|x| @ |w|^T * (2 * 2^-4 + 2^-8): both operands rounded, plus a margin for tiny values."""
    return (x.abs() @ w.abs().T) * (2 * 2**-4 + 2**-8) + 1e-4


@pytest.mark.parametrize("m", [1, 5])
def test_fp8_linear_per_channel_and_per_tensor_vs_float(m):
    x, w = _rand(m, 64, seed=1), _rand(48, 64, seed=2) / 8
    ref = x @ w.T
    q, s = quantize_rows(w)
    out = fp8_linear(x.to(DEVICE), q.to(DEVICE), s.to(DEVICE)).float().cpu()
    assert out.shape == (m, 48)
    assert ((out - ref).abs() <= _gemm_bound(x, w)).all()
    qt, st = quantize_tensor(w)  # a per-tensor scale runs as per-channel with equal scales
    out_t = fp8_linear(x, qt, st.expand(48).contiguous())
    assert ((out_t - ref).abs() <= _gemm_bound(x, w)).all()


def test_block_fp8_linear_128_vs_float():
    x, w = _rand(4, 256, seed=3), _rand(384, 256, seed=4) / 16
    q, s = quantize_blocks(w, (128, 128))
    out = block_fp8_linear(x.to(DEVICE), q.to(DEVICE), s.to(DEVICE), (128, 128)).float().cpu()
    assert out.shape == (4, 384)
    assert ((out - x @ w.T).abs() <= _gemm_bound(x, w)).all()


def test_triton_block_matmul_matches_the_reference():
    pytest.importorskip("triton")
    from mini_sglang.layers.quantization.fp8_kernels import w8a8_block_matmul

    x, w = _rand(3, 96, seed=5), _rand(64, 96, seed=6)  # 2 x 3 blocks of 32
    xq, xs = per_token_group_quant(x, 32)
    wq, ws = quantize_blocks(w, (32, 32))
    if DEVICE == "cpu":  # the interpreter has no FP8 numpy dtype: FP8 values in float32
        xq, wq = xq.float(), wq.float()
    out = w8a8_block_matmul(
        xq.to(DEVICE), wq.to(DEVICE), xs.to(DEVICE), ws.to(DEVICE), (32, 32), torch.float32, bm=16
    ).cpu()
    ref = (xq.float() * xs.repeat_interleave(32, 1)) @ dequantize_blocks(wq, ws, (32, 32)).T
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("group", [32, 100])  # 100: per token (one group of the row)
def test_triton_group_quant_matches_torch(group):
    pytest.importorskip("triton")
    from mini_sglang.layers.quantization.fp8_kernels import FP8_DTYPE, group_quant_triton

    x = _rand(3, 100, seed=10)
    x[1] = 0.0  # an all-zero row: the smallest scale, zeros
    q_ref, s_ref = per_token_group_quant(x, group)  # torch on CPU
    out = None if DEVICE == "cuda" else torch.empty(3, 100)  # interpreter: FP8 values in f32
    q, s = group_quant_triton(x.to(DEVICE), group, out=out)
    assert s.shape == s_ref.shape == (3, -(-100 // group))
    torch.testing.assert_close(s.cpu(), s_ref, rtol=0, atol=0)
    torch.testing.assert_close(q.cpu().to(FP8_DTYPE).float(), q_ref.float(), rtol=0, atol=0)


@pytest.mark.parametrize("with_residual", [False, True])
def test_rmsnorm_quant_is_the_norm_then_the_quantization(with_residual):
    """fused_kernels' RMSNorm with per-token FP8 output: the values and scales of the norm
    kernel followed by the quantization kernel (exactly), the residual stream updated as
    the norm updates it, and x left as it was; an all-zero row gets the smallest scale."""
    pytest.importorskip("triton")
    from mini_sglang.layers import fused_kernels
    from mini_sglang.layers.quantization.fp8_kernels import (
        FP8_DTYPE,
        group_quant_triton,
        rmsnorm_per_token_quant,
    )

    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    x = _rand(4, 200, seed=3).to(DEVICE, dtype)
    res = _rand(4, 200, seed=4).to(DEVICE, dtype)
    x[2], res[2] = 0.0, 0.0
    w = (1 + 0.1 * torch.randn(200, generator=torch.Generator().manual_seed(5))).to(DEVICE, dtype)
    # the interpreter has no FP8 dtype: FP8 values in float32
    fp8_out = lambda: None if DEVICE == "cuda" else torch.empty(4, 200)  # noqa: E731
    r_fused = res.clone() if with_residual else None
    x_fused = x.clone()
    q, s = rmsnorm_per_token_quant(x_fused, w, 1e-6, r_fused, out=fp8_out())
    r_ref = res.clone() if with_residual else None
    h = fused_kernels.rmsnorm(x.clone(), w, 1e-6, r_ref)
    q_ref, s_ref = group_quant_triton(h, 200, out=fp8_out())
    assert q.shape == (4, 200) and s.shape == (4, 1)
    torch.testing.assert_close(s, s_ref, rtol=0, atol=0)
    torch.testing.assert_close(q.float(), q_ref.float(), rtol=0, atol=0)
    assert torch.equal(x_fused, x)
    if with_residual:
        assert torch.equal(r_fused, r_ref) and torch.equal(r_fused, x + res)
    assert s[2].item() == pytest.approx(1e-10 / 448) and not q[2].float().any()
    # and against torch: RMSNorm as HF computes it, then per-token quantization
    from mini_sglang.layers.layernorm import RMSNorm

    norm = RMSNorm(200, 1e-6).to(DEVICE)
    norm.weight.data = w
    ref = norm.forward_native(x, res)[0] if with_residual else norm.forward_native(x)
    q_torch, s_torch = per_token_quant(ref.float().cpu())
    torch.testing.assert_close(s.cpu(), s_torch, rtol=1e-5, atol=0)
    deq = q.cpu().to(FP8_DTYPE).float() * s.cpu()
    torch.testing.assert_close(deq, q_torch.float() * s_torch, rtol=0, atol=float(s.max()) * 32)


def test_silu_mul_quant_is_the_activation_then_the_quantization():
    """fused_kernels' SiLU-and-mul with per-token FP8 output: exactly the values and scales
    of the activation kernel followed by the quantization kernel, and close to torch's."""
    pytest.importorskip("triton")
    from mini_sglang.layers import fused_kernels
    from mini_sglang.layers.quantization.fp8_kernels import (
        FP8_DTYPE,
        group_quant_triton,
        silu_mul_per_token_quant,
    )

    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    x = _rand(3, 2 * 300, seed=6).to(DEVICE, dtype)  # d = 300: a masked tail of the block
    x[1] = 0.0
    fp8_out = lambda: None if DEVICE == "cuda" else torch.empty(3, 300)  # noqa: E731
    q, s = silu_mul_per_token_quant(x, out=fp8_out())
    q_ref, s_ref = group_quant_triton(fused_kernels.silu_and_mul(x), 300, out=fp8_out())
    assert q.shape == (3, 300) and s.shape == (3, 1)
    torch.testing.assert_close(s, s_ref, rtol=0, atol=0)
    torch.testing.assert_close(q.float(), q_ref.float(), rtol=0, atol=0)
    y = torch.nn.functional.silu(x[:, :300].float().cpu()) * x[:, 300:].float().cpu()
    q_torch, s_torch = per_token_quant(y)
    torch.testing.assert_close(s.cpu(), s_torch, rtol=1e-2 if DEVICE == "cuda" else 1e-5, atol=0)
    deq = q.cpu().to(FP8_DTYPE).float() * s.cpu()
    torch.testing.assert_close(deq, y, rtol=0.07, atol=float(s.max()) * 32)


@pytest.mark.parametrize("silu_mul", [False, True])
def test_gemv_with_per_row_weight_scales(silu_mul):
    pytest.importorskip("triton")
    from mini_sglang.layers.small_m_gemm import gemv

    x, w = _rand(2, 256, seed=7), _rand(64, 256, seed=8) / 16
    wq, s = quantize_rows(w)
    wv = wq.float() if DEVICE == "cpu" else wq
    out = gemv(x.to(DEVICE), wv.to(DEVICE), (4, 128, 4), silu_mul=silu_mul, w_scale=s.to(DEVICE))
    y = x @ dequantize_rows(wq, s).T
    ref = torch.nn.functional.silu(y[:, :32]) * y[:, 32:] if silu_mul else y
    torch.testing.assert_close(out.float().cpu(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("silu_mul", [False, True])
def test_gemv_tensor_core_dot_configs_match_the_elementwise_ones(silu_mul):
    """The FP8 candidates with tensor-core dots (small_m_gemm._FP8_DOT_CONFIGS' form: a
    trailing 1) compute what the elementwise configs compute, through the norm prologue
    and the residual epilogue too, for 1 and 3 rows (padded to 16), three K tiles."""
    pytest.importorskip("triton")
    from mini_sglang.layers import small_m_gemm
    from mini_sglang.layers.small_m_gemm import gemv

    assert all(len(c) == 5 and c[4] == 1 for c in small_m_gemm._FP8_DOT_CONFIGS)
    assert small_m_gemm.candidates(("fp8",))[-len(small_m_gemm._FP8_DOT_CONFIGS) :] == (
        small_m_gemm._FP8_DOT_CONFIGS
    )
    assert small_m_gemm.candidates(("silu_mul",), rows=2) == small_m_gemm._CONFIGS
    silu_dots = [
        c for c in small_m_gemm.candidates(("silu_mul", "fp8"), rows=2) if len(c) == 5 and c[4] == 1
    ]
    assert silu_dots and all(c[0] >= 32 for c in silu_dots)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    # bf16 operands round x (times the norm weight) once more than the fp32 multiply does:
    # an error relative to the pre-SiLU products, whose scale is the output's largest value,
    # so an output near zero after SiLU-mul keeps an error of that scale (measured on an
    # H200: 0.055 at 1.23, the output's largest value 33)
    rtol, atol_per_max = (2e-2, 4e-3) if DEVICE == "cuda" else (1e-5, 1e-6)
    w = _rand(64, 384, seed=8) / 16
    wq, s = quantize_rows(w)
    wv = (wq.float() if DEVICE == "cpu" else wq).to(DEVICE)
    n_out = 32 if silu_mul else 64
    for m in (1, 3):
        x = _rand(m, 384, seed=m).to(DEVICE, dtype)
        g = (1 + 0.2 * _rand(384, seed=9)).to(DEVICE, dtype)
        res = _rand(m, n_out, seed=10).to(DEVICE, dtype)
        for kw in ({}, {"norm_weight": g, "eps": 1e-6}, {"residual": res}):
            outs = []
            # (16, ...) with SiLU-mul: gate_up's pick is timed without it, and gemv widens
            # the dot config's row block to 32 (16 gate rows) rather than fail to compile
            for cfg in ((32, 128, 4), (32, 128, 4, 2, 1), (16, 128, 4, 2, 1)):
                args = dict(kw, residual=kw["residual"].clone()) if "residual" in kw else kw
                outs.append(gemv(x, wv, cfg, silu_mul=silu_mul, w_scale=s.to(DEVICE), **args))
            ref = outs[0].float()
            atol = max(atol_per_max * ref.abs().max().item(), 2e-2 if DEVICE == "cuda" else 1e-5)
            for out in outs[1:]:
                torch.testing.assert_close(out.float(), ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("m, x_form", [(1, "dtype"), (3, "dtype"), (1, "words"), (1, "offset")])
def test_gemv_integer_decoding_grid_configs_match_the_elementwise_ones(m, x_form):
    """The grid kernel's integer e4m3 decoding (a 5-tuple ending in PERSISTENT_BITS, as
    _FP8_GRID_BITS_CONFIGS: the FP8 weight read as int32 words of four) computes what the
    elementwise fp32 conversion computes, plain and through each fused variant, where K
    leaves the last tile part-filled (100 words against tiles of 32). x in the test's
    dtype, or one bf16 row read as int64 words of four (x_form "words"), or a bf16 row at
    an offset that leaves it 2-byte aligned, which the kernel reads as bf16 ("offset")."""
    pytest.importorskip("triton")
    from mini_sglang.layers import small_m_gemm
    from mini_sglang.layers.small_m_gemm import gemv

    grid_bits = small_m_gemm._FP8_GRID_BITS_CONFIGS
    assert grid_bits and all(
        len(c) == 5 and c[4] == small_m_gemm.PERSISTENT_BITS for c in grid_bits
    )
    assert not any(small_m_gemm.is_persistent(c) for c in grid_bits)
    assert set(grid_bits) <= set(small_m_gemm.candidates(("fp8",), rows=m))
    assert not set(grid_bits) & set(small_m_gemm.candidates(rows=m))
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    n, k = 24, 400
    w = _rand(n, k, seed=21) / 16
    wq, s = quantize_rows(w)
    wv = (wq.float() if DEVICE == "cpu" else wq).to(DEVICE)
    scale = s.to(DEVICE)
    if x_form != "dtype":
        dtype = torch.bfloat16
    off = 1 if x_form == "offset" else 0
    x = _rand(m, k + off, seed=22).to(DEVICE, dtype)[:, off:]
    g = (1 + 0.2 * _rand(k + off, seed=23)).to(DEVICE, dtype)[off:]
    assert small_m_gemm._bf16_words(x) == (x_form != "offset" and dtype == torch.bfloat16)
    rtol, atol = (2e-2, 2e-2) if dtype == torch.bfloat16 else (1e-5, 1e-5)
    variants = (
        {},
        {"silu_mul": True},
        {"norm_weight": g, "eps": 1e-6},
        {"eps": 1e-6},
        {"residual": _rand(m, n, seed=24).to(DEVICE, dtype)},
        {"silu_mul": True, "norm_weight": g, "eps": 1e-6},
    )
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        gemv(x, wv.float(), (4, 128, 4, 2, small_m_gemm.PERSISTENT_BITS), w_scale=scale)
    for kw in variants:
        args = [dict(kw, residual=kw["residual"].clone()) if "residual" in kw else kw for _ in "ab"]
        ref = gemv(x, wv, (4, 128, 4), w_scale=scale, **args[0])
        out = gemv(
            x, wq.to(DEVICE), (4, 128, 4, 2, small_m_gemm.PERSISTENT_BITS), w_scale=scale, **args[1]
        )
        assert out.shape == ref.shape == (m, n // 2 if "silu_mul" in kw else n)
        torch.testing.assert_close(out.float(), ref.float(), rtol=rtol, atol=atol)
        if not kw:  # and against torch itself
            expect = x.float() @ (wv.float() * scale[:, None]).T
            torch.testing.assert_close(out.float(), expect, rtol=rtol, atol=atol)


@pytest.mark.parametrize("m", [1, 3])
def test_gemv_dense_down_config_matches_the_grid_kernel(m):
    """A DENSE_DOWN config runs fused_moe_gemv.channel_fp8_gemv at its tiles: the result of
    the grid kernel, plain and adding into the residual; a prologue it lacks is refused."""
    pytest.importorskip("triton")
    from mini_sglang.layers import small_m_gemm
    from mini_sglang.layers.small_m_gemm import gemv

    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    rtol, atol = (2e-2, 2e-2) if dtype == torch.bfloat16 else (1e-5, 1e-5)
    n, k = 24, 384
    wq, s = quantize_rows(_rand(n, k, seed=31) / 16)
    wv = (wq.float() if DEVICE == "cpu" else wq).to(DEVICE)
    scale = s.to(DEVICE)
    x = _rand(m, k, seed=32).to(DEVICE, dtype)
    dense = (8, 128, 4, 0, small_m_gemm.DENSE_DOWN)
    ref = gemv(x, wv, (4, 128, 4), w_scale=scale)
    torch.testing.assert_close(gemv(x, wq.to(DEVICE), dense, w_scale=scale).float(),
                               ref.float(), rtol=rtol, atol=atol)  # fmt: skip
    r = _rand(m, n, seed=33).to(DEVICE, dtype)
    got = gemv(x, wq.to(DEVICE), dense, w_scale=scale, residual=r.clone())
    expect = gemv(x, wv, (4, 128, 4), w_scale=scale, residual=r.clone())
    torch.testing.assert_close(got.float(), expect.float(), rtol=rtol, atol=atol)
    with pytest.raises(ValueError, match="without a prologue"):
        gemv(x, wq.to(DEVICE), dense, w_scale=scale, silu_mul=True)


@pytest.mark.parametrize("fp8", [False, True])
def test_gemv_persistent_configs_match_the_grid_ones(fp8):
    """The one-row persistent configs (small_m_gemm._ROW_CONFIGS and, for FP8 weights, the
    integer-decoding _FP8_ROW_CONFIGS: a few programs per SM striding over row blocks, x
    loaded once) compute what a grid config computes, plain and through each fused variant,
    where N leaves the last program's next block past the end and K is not a power of two
    (a multiple of 4, for the decoding's int32 words). They are candidates at one row only
    and refuse more."""
    pytest.importorskip("triton")
    from mini_sglang.layers import small_m_gemm
    from mini_sglang.layers.small_m_gemm import gemv

    rows = small_m_gemm._ROW_CONFIGS
    assert rows and all(small_m_gemm.is_persistent(c) for c in rows)
    assert set(rows) <= set(small_m_gemm.candidates(("norm",)))
    assert not set(rows) & set(small_m_gemm.candidates(("norm", "fp8")))
    assert not set(rows) & set(small_m_gemm.candidates(("norm",), rows=2))
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    n, k = 44, 304  # 44 rows: 11 blocks of 4 over the interpreter's 2 x 4 programs
    w = _rand(n, k, seed=11) / 16
    if fp8:
        wq, s = quantize_rows(w)
        wv = (wq.float() if DEVICE == "cpu" else wq).to(DEVICE)
        scale = {"w_scale": s.to(DEVICE)}
    else:
        wv, scale = w.to(DEVICE, dtype), {}
    x = _rand(1, k, seed=12).to(DEVICE, dtype)
    g = (1 + 0.2 * _rand(1, k, seed=13)[0]).to(DEVICE, dtype)
    rtol, atol = (2e-2, 2e-2) if DEVICE == "cuda" else (1e-5, 1e-5)
    variants = (
        {},
        {"silu_mul": True},
        {"norm_weight": g, "eps": 1e-6},
        {"eps": 1e-6},
        {"residual": _rand(1, n, seed=14).to(DEVICE, dtype)},
        {"silu_mul": True, "norm_weight": g, "eps": 1e-6},  # the post-attention fold
    )
    configs = [(4, 0, 4, 1, small_m_gemm.PERSISTENT, 4), (1, 0, 4, 1, small_m_gemm.PERSISTENT, 2)]
    if fp8:  # integer decoding reads the e4m3 bytes themselves, also in the interpreter
        bits = small_m_gemm._FP8_ROW_CONFIGS
        assert bits and all(c[4] == small_m_gemm.PERSISTENT_BITS for c in bits)
        assert set(bits) <= set(small_m_gemm.candidates(("fp8",))) - set(small_m_gemm.candidates())
        assert not set(bits) & set(small_m_gemm.candidates(("fp8",), rows=2))
        configs += [
            (4, 0, 4, 1, small_m_gemm.PERSISTENT_BITS, 4),
            (1, 0, 4, 1, small_m_gemm.PERSISTENT_BITS, 2),
        ]
        with pytest.raises(ValueError, match="float8_e4m3fn"):
            gemv(x, wv.float(), configs[-1], **scale)
    for kw in variants:
        for cfg in configs:
            args = [
                dict(kw, residual=kw["residual"].clone()) if "residual" in kw else kw for _ in "ab"
            ]
            ref = gemv(x, wv, (4, 128, 4), **scale, **args[0])
            wc = wq.to(DEVICE) if cfg[4] == small_m_gemm.PERSISTENT_BITS else wv
            out = gemv(x, wc, cfg, **scale, **args[1])
            assert out.shape == ref.shape == (1, n // 2 if "silu_mul" in kw else n)
            torch.testing.assert_close(out.float(), ref.float(), rtol=rtol, atol=atol)
            if "silu_mul" in kw and "norm_weight" in kw:  # and against torch itself
                xf = x.float()
                h = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * g.float()
                wf = wv.float() * (scale["w_scale"][:, None] if fp8 else 1)
                gate, up = (h @ wf.T).chunk(2, dim=-1)
                expect = torch.nn.functional.silu(gate) * up
                torch.testing.assert_close(out.float(), expect, rtol=rtol, atol=atol)
    with pytest.raises(ValueError, match="one row"):
        gemv(x.expand(2, k).contiguous(), wv, rows[0], **scale)


@pytest.mark.parametrize("block", [(8, 16), (16, 32)])
def test_gemv_persistent_block_scales_against_the_dequantized_weight(block):
    """Block-wise FP8 scales (w_block: one scale per (rows, columns) block, Qwen3-FP8's
    format at 128 x 128) in the persistent integer-decoding configs: each row block takes
    its block row's scales, one per loaded column, so the result is x @ dequantized(w)^T,
    plain and through each fused variant, where K ends inside a block (304 = 19 x 16, or
    9.5 x 32) and the last programs' next blocks lie past N. These configs are the block
    variant's only candidates, at one row only; a grid config refuses block scales."""
    pytest.importorskip("triton")
    from mini_sglang.layers import small_m_gemm
    from mini_sglang.layers.small_m_gemm import gemv

    variant = (f"fp8block{block[0]}x{block[1]}",)
    assert small_m_gemm.block_of(variant) == block
    assert small_m_gemm.block_of(("norm", "fp8")) is None
    block_rows = small_m_gemm._FP8_BLOCK_ROW_CONFIGS
    assert small_m_gemm.candidates(variant) == block_rows
    assert set(small_m_gemm._FP8_ROW_CONFIGS) < set(block_rows)
    assert all(c[4] == small_m_gemm.PERSISTENT_BITS for c in block_rows)
    assert small_m_gemm.candidates(("residual", *variant), rows=2) == []
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    n, k = 64, 304  # 16 blocks of 4 rows over the interpreter's 2 x 4 programs
    w = _rand(n, k, seed=31) / 16
    wq, s = quantize_blocks(w, block)
    assert s.shape == (n // block[0], -(-k // block[1])) and s.std() > 0
    wq, s = wq.to(DEVICE), s.to(DEVICE)
    wf = dequantize_blocks(wq.cpu(), s.cpu(), block)
    x = _rand(1, k, seed=32).to(DEVICE, dtype)
    g = (1 + 0.2 * _rand(1, k, seed=33)[0]).to(DEVICE, dtype)
    r = _rand(1, n, seed=34).to(DEVICE, dtype)
    xf = x.float().cpu()
    h = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * g.float().cpu()
    silu_mul = lambda y: torch.nn.functional.silu(y[:, : y.shape[1] // 2]) * y[:, y.shape[1] // 2 :]  # noqa: E731
    cases = (
        ({}, xf @ wf.T),
        ({"silu_mul": True}, silu_mul(xf @ wf.T)),
        ({"norm_weight": g, "eps": 1e-6}, h @ wf.T),
        ({"residual": r}, r.float().cpu() + xf @ wf.T),
        ({"silu_mul": True, "norm_weight": g, "eps": 1e-6}, silu_mul(h @ wf.T)),
    )
    rtol, atol = (2e-2, 2e-2) if DEVICE == "cuda" else (1e-5, 1e-5)
    configs = [
        (4, 0, 4, 1, small_m_gemm.PERSISTENT_BITS, 4),
        (8, 0, 4, 1, small_m_gemm.PERSISTENT_BITS, 1),
    ]
    for kw, expect in cases:
        for cfg in configs:
            args = dict(kw, residual=kw["residual"].clone()) if "residual" in kw else kw
            out = gemv(x, wq, cfg, w_scale=s, w_block=block, **args)
            assert out.shape == expect.shape
            torch.testing.assert_close(out.float().cpu(), expect, rtol=rtol, atol=atol)
    with pytest.raises(ValueError, match="persistent"):
        gemv(x, wq, (4, 128, 4, 2, small_m_gemm.PERSISTENT_BITS), w_scale=s, w_block=block)


# ---- which quantization a model gets ----------------------------------------------------


def test_registry_serves_every_supported_method():
    assert set(QUANTIZATION_METHODS) == set(SUPPORTED_METHODS)
    assert set(SUPPORTED_QUANTIZATION) == {"gguf", *SUPPORTED_METHODS}


def test_parse_quantization_formats():
    assert parse_quantization(None, None) is None
    assert parse_quantization("gguf", None) is None
    assert parse_quantization("fp8", None) == QuantSpec("fp8")
    block = {"quant_method": "fp8", "weight_block_size": [128, 128], "ignored_layers": ["a"]}
    assert parse_quantization(None, block) == QuantSpec("fp8", True, (128, 128), ("a",))
    assert parse_quantization("fp8", {"quant_method": "fp8"}) == QuantSpec("fp8", True)
    ct = {
        "quant_method": "compressed-tensors",
        "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float", "strategy": "tensor"}}},
        "ignore": ["lm_head"],
    }
    assert parse_quantization(None, ct) == QuantSpec("compressed-tensors", True, None, ("lm_head",))


@pytest.mark.parametrize(
    "flag, cfg, message",
    [
        ("awq", None, "Unsupported quantization method: awq"),
        (None, {"quant_method": "gptq", "bits": 4}, "Unsupported quantization method: gptq"),
        (
            None,
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int"}}},
            },
            "Unsupported quantization method: compressed-tensors group 'g'",
        ),
        ("fp8", {"quant_method": "awq"}, "does not match"),
        ("compressed-tensors", None, "needs a compressed-tensors checkpoint"),
    ],
)
def test_parse_quantization_refuses_with_one_line(flag, cfg, message):
    with pytest.raises(ValueError, match=message) as e:
        parse_quantization(flag, cfg)
    assert "\n" not in str(e.value)


def test_ignored_layers_match_fused_projections():
    ignored = ["model.layers.0.self_attn.q_proj", "re:.*mlp\\.(gate|up)_proj"]
    assert is_layer_ignored("model.layers.3.mlp.gate_up_proj", ignored)
    assert not is_layer_ignored("model.layers.0.mlp.down_proj", ignored)
    with pytest.raises(ValueError, match="some of its projections"):
        is_layer_ignored("model.layers.0.self_attn.qkv_proj", ignored)


def test_unsupported_checkpoint_quantization_stops_the_launch(tmp_path):
    from types import SimpleNamespace

    from mini_sglang.entrypoints.startup import StartupError, check_quantization

    config = {"architectures": ["LlamaForCausalLM"], "quantization_config": {"quant_method": "awq"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    args = SimpleNamespace(model_path=str(tmp_path), quantization=None)
    with pytest.raises(StartupError, match="Unsupported quantization method: awq"):
        check_quantization(args)
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    check_quantization(args)
    # --json-model-override-args' quantization_config is the one judged.
    args.json_model_override_args = json.dumps({"quantization_config": {"quant_method": "awq"}})
    with pytest.raises(StartupError, match="Unsupported quantization method: awq"):
        check_quantization(args)


# ---- tensor-parallel sharding of every method -------------------------------------------

SPECS = {
    "unquantized": None,
    "online": QuantSpec("fp8"),
    "per-tensor": QuantSpec("fp8", checkpoint_fp8=True),
    "block": QuantSpec("fp8", checkpoint_fp8=True, weight_block_size=(16, 16)),
    # unquantized tensors into a block-wise model (an online update): quantized per block
    "block-from-bf16": QuantSpec("fp8", checkpoint_fp8=True, weight_block_size=(16, 16)),
}


def _checkpoint_tensors(kind: str, w: torch.Tensor) -> dict[str, torch.Tensor]:
    """What a checkpoint of this kind holds for the projection weight w."""
    if kind in ("unquantized", "online", "block-from-bf16"):
        return {"weight": w.to(torch.bfloat16).float() if kind == "block-from-bf16" else w}
    if kind == "per-tensor":
        q, s = quantize_tensor(w)
        return {"weight": q, "weight_scale": s}
    q, s = quantize_blocks(w, (16, 16))
    return {"weight": q, "weight_scale_inv": s}


def _build(monkeypatch, kind: str, tp: int, rank: int, projections):
    """QKV (4 q heads, 2 kv heads of 16), gate/up (2 x 64 from 32) and a row-parallel
    (64 -> 32) layer at (tp, rank), loaded from the full projections."""
    from mini_sglang.layers import linear
    from mini_sglang.layers.quantization.fp8 import Fp8Config

    monkeypatch.setattr(linear, "get_tp_size", lambda: tp)
    monkeypatch.setattr(linear, "get_tp_rank", lambda: rank)
    cfg = None if SPECS[kind] is None else Fp8Config(SPECS[kind])
    layers = {
        "qkv": linear.QKVParallelLinear(32, 16, 4, 2, quant_config=cfg),
        "gate_up": linear.MergedColumnParallelLinear(32, [64, 64], quant_config=cfg),
        "row": linear.RowParallelLinear(64, 32, quant_config=cfg),
    }
    params = {(k, n): p for k, layer in layers.items() for n, p in layer.named_parameters()}
    for (layer_name, shard_id), w in projections.items():
        for pname, t in _checkpoint_tensors(kind, w).items():
            param = params[(layer_name, pname)]
            args = () if shard_id is None else (shard_id,)
            param.weight_loader(param, t, *args)
    return {k: layer.quant_method.dequantized_weight(layer) for k, layer in layers.items()}


def _rows(t: torch.Tensor, n: int, rank: int) -> torch.Tensor:
    return t[rank * n : (rank + 1) * n]


@pytest.mark.parametrize("kind", list(SPECS))
def test_tp_shards_of_every_method_are_slices_of_tp1(monkeypatch, kind):
    gen = torch.Generator().manual_seed(9)
    shapes = {
        ("qkv", "q"): (64, 32), ("qkv", "k"): (32, 32), ("qkv", "v"): (32, 32),
        ("gate_up", 0): (64, 32), ("gate_up", 1): (64, 32), ("row", None): (32, 64),
    }  # fmt: skip
    projections = {key: torch.randn(shape, generator=gen) for key, shape in shapes.items()}
    full = _build(monkeypatch, kind, 1, 0, projections)
    for rank in (0, 1):
        got = _build(monkeypatch, kind, 2, rank, projections)
        q, k, v = full["qkv"].split([64, 32, 32])
        want_qkv = torch.cat([_rows(q, 32, rank), _rows(k, 16, rank), _rows(v, 16, rank)])
        torch.testing.assert_close(got["qkv"], want_qkv)
        gate, up = full["gate_up"].split([64, 64])
        want_gate_up = torch.cat([_rows(gate, 32, rank), _rows(up, 32, rank)])
        torch.testing.assert_close(got["gate_up"], want_gate_up)
        cols = slice(rank * 32, (rank + 1) * 32)
        if kind == "block-from-bf16":
            wq, ws = quantize_blocks(projections[("qkv", "q")].to(torch.bfloat16).float(), (16, 16))
            q_full = full["qkv"][:64]
            torch.testing.assert_close(q_full, dequantize_blocks(wq, ws, (16, 16)))
        if kind == "online":  # each rank scales the rows of its own columns
            want = dequantize_rows(*quantize_rows(projections[("row", None)][:, cols]))
        else:
            want = full["row"][:, cols]
        torch.testing.assert_close(got["row"], want)

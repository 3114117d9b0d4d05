"""small_m_gemm's choice between cuBLAS and the Triton GEMV from their standalone timings
(choose / pick_rule), on the timings that decided it on real cards
(docs/performance/decode-gemv.md): under PDL a Triton GEMV earns a fixed credit for the
launch and ramp it hides, not a factor of its time."""

from __future__ import annotations

import torch

from mini_sglang.layers.small_m_gemm import (
    DENSE_DOWN,
    PERSISTENT,
    PERSISTENT_BITS,
    _fits,
    _parse_forced,
    choose,
    forced_choice,
    is_persistent,
    pick_rule,
)

US = 1e-3  # timings are in ms
TRITON = (2, 4096, 8, 1)


def _times(triton_us: float, cublas_us: float) -> dict:
    return {None: cublas_us * US, TRITON: triton_us * US, (4, 1024, 4, 2): (triton_us + 5) * US}


def test_long_gemv_within_a_few_percent_goes_to_cublas_under_pdl():
    # H200, Llama-3.1-8B gate_up and down at batch 1: Triton 57.3 / 32.7 us vs cuBLAS 57.6 /
    # 30.7 standalone; inside the decode step cuBLAS ran them faster (4.64 vs 4.81 ms/token)
    assert choose(_times(57.3, 57.6), credit_ms=1 * US) is None
    assert choose(_times(32.7, 30.7), credit_ms=1 * US) is None


def test_short_gemv_slightly_slower_than_cublas_keeps_triton_under_pdl():
    # Qwen3-0.6B's 2-6 us GEMVs: PDL's hidden launch outweighs a fraction of a microsecond
    assert choose(_times(3.2, 3.0), credit_ms=1 * US) == TRITON
    assert choose(_times(3.2, 3.0)) is None  # without PDL the faster kernel standalone wins


def test_clearly_faster_triton_wins_either_way():
    # H100, Llama-3.1-8B down: Triton 42.2 vs cuBLAS 44.4 us
    assert choose(_times(42.2, 44.4)) == TRITON
    assert choose(_times(42.2, 44.4), credit_ms=1 * US) == TRITON


def test_no_credit_without_pdl():
    assert pick_rule(torch.zeros(1, 8)) == {"credit_ms": 0.0}  # CPU: no PDL


def test_forced_configs_parse_shape_to_config_or_cublas():
    # MINI_SGLANG_GEMV_CONFIGS, the experiments' override of the timed pick
    forced = _parse_forced("4096x4096:4,2048,4,2;28672x4096:cublas;;1024x3072:2,4096,8")
    assert forced == {
        (4096, 4096): (4, 2048, 4, 2),
        (28672, 4096): None,
        (1024, 3072): (2, 4096, 8),
    }
    # '/' separates entries too (an A/B arm's value, where ';' separates the arms)
    assert _parse_forced("4096x4096:4,2048,4,2/28672x4096:cublas") == {
        (4096, 4096): (4, 2048, 4, 2),
        (28672, 4096): None,
    }
    assert _parse_forced("") == {}
    # a forced cuBLAS (None) applies at every bucket of M, as a grid config does; only a
    # persistent config is kept to one row
    assert [is_persistent(c) for c in forced.values()] == [False, False, False]
    assert is_persistent((2, 0, 8, 1, PERSISTENT, 4))


def test_forced_configs_apply_only_where_they_can_run():
    # an integer-decoding config reads e4m3 words: not a bf16 weight of the same shape (a
    # layer a block-wise FP8 checkpoint left unquantized); a block-scaled FP8 weight takes
    # only persistent configs or None (its own block_fp8_gemv, "cublas" in the variable)
    bf16 = torch.zeros(8, 8, dtype=torch.bfloat16)
    fp8 = torch.zeros(8, 8).to(torch.float8_e4m3fn)
    bits = (2, 0, 4, 1, PERSISTENT_BITS, 4)
    grid = (4, 2048, 4, 2)
    assert not _fits(bits, bf16, ("norm",)) and _fits(bits, fp8, ("norm", "fp8"))
    assert _fits(grid, bf16, ()) and _fits(None, bf16, ())
    block = ("residual", "fp8block128x128")
    assert _fits(bits, fp8, block) and _fits(None, fp8, block)
    assert not _fits(grid, fp8, block)
    # the dense down kernel (channel_fp8_gemv): a per-row scaled FP8 weight, plain or adding
    # into the residual; no norm or SiLU-mul prologue, no bf16 or block-scaled weight
    dense = (16, 512, 8, 0, DENSE_DOWN)
    assert _fits(dense, fp8, ("fp8",)) and _fits(dense, fp8, ("residual", "fp8"))
    assert not _fits(dense, fp8, ("norm", "fp8")) and not _fits(dense, fp8, ("silu_mul", "fp8"))
    assert not _fits(dense, bf16, ()) and not _fits(dense, fp8, block)
    assert not is_persistent(dense)


def test_forced_choice_per_variant_and_bucket():
    # what MINI_SGLANG_GEMV_CONFIGS makes of one shape's calls: a grid config at every bucket,
    # a persistent one at one row only, a config the weight cannot run not at all (()), and a
    # DENSE_DOWN one the norm / SiLU-mul variants unfused (None), the plain one on it
    bf16 = torch.zeros(8, 8, dtype=torch.bfloat16)
    fp8 = torch.zeros(8, 8).to(torch.float8_e4m3fn)
    grid, row = (4, 2048, 4, 2), (2, 0, 8, 1, PERSISTENT, 4)
    dense = (16, 512, 8, 0, DENSE_DOWN)
    assert forced_choice((), bf16, (), 1) == ()
    assert forced_choice(grid, bf16, ("norm",), 4) == grid
    assert forced_choice(None, bf16, (), 4) is None
    assert forced_choice(row, bf16, (), 1) == row and forced_choice(row, bf16, (), 2) == ()
    assert forced_choice((2, 0, 4, 1, PERSISTENT_BITS, 4), bf16, (), 1) == ()
    assert forced_choice(dense, fp8, ("fp8",), 4) == dense
    assert forced_choice(dense, fp8, ("residual", "fp8"), 2) == dense
    assert forced_choice(dense, fp8, ("norm", "fp8"), 4) is None
    assert forced_choice(dense, bf16, ("norm",), 4) == ()
    assert forced_choice(dense, fp8, ("fp8block128x128",), 1) == ()


def test_per_channel_fp8_at_three_or_four_rows_runs_the_dense_down_kernel(monkeypatch):
    # the in-model A/B's rule (CHANNEL_FP8_DENSE): the 4-row bucket only, per-channel FP8
    # weights up to CHANNEL_FP8_DENSE_MAX_BYTES only, the norm variant unfused; a config forced for the shape or the opt-out keeps the
    # timed pick (())
    from mini_sglang.layers import small_m_gemm

    fp8 = torch.zeros(8, 8).to(torch.float8_e4m3fn)
    bf16 = torch.zeros(8, 8, dtype=torch.bfloat16)
    dense = small_m_gemm.CHANNEL_FP8_DENSE
    assert small_m_gemm.is_dense_down(dense)
    choice = small_m_gemm.channel_fp8_dense_choice
    assert choice(fp8, ("fp8",), 4) == dense
    assert choice(fp8, ("residual", "fp8"), 4) == dense
    assert choice(fp8, ("norm", "fp8"), 4) is None
    assert choice(fp8, ("fp8",), 2) == () and choice(fp8, ("fp8",), 8) == ()
    assert choice(bf16, (), 4) == () and choice(bf16, ("norm",), 4) == ()
    assert choice(fp8, ("fp8block128x128",), 4) == ()
    # Qwen3-30B-A3B's qkv (10 MiB) takes it, Llama-3.1-8B's o_proj (16 MiB) keeps its pick
    assert choice(torch.empty(5120, 2048, dtype=torch.float8_e4m3fn), ("fp8",), 4) == dense
    assert choice(torch.empty(4096, 4096, dtype=torch.float8_e4m3fn), ("fp8",), 4) == ()
    monkeypatch.setattr(small_m_gemm, "_FORCED", {(8, 8): (4, 2048, 4, 2)})
    assert choice(fp8, ("fp8",), 4) == ()
    monkeypatch.setattr(small_m_gemm, "_FORCED", {})
    monkeypatch.setattr(small_m_gemm, "_CHANNEL_DENSE", False)
    assert choice(fp8, ("fp8",), 4) == ()


def test_per_channel_fp8_pick_times_the_layers_own_path(monkeypatch):
    # key None of an FP8 pick times what Fp8LinearMethod runs where the GEMV loses: the norm
    # kernel, x quantized per token for the registered GEMM, the SiLU-mul kernel, the
    # residual add. Each variant's fallback computes what its fused GEMV computes.
    import torch.nn.functional as F

    from mini_sglang.layers import small_m_gemm
    from mini_sglang.layers.quantization import fp8  # registers fp8_linear
    from mini_sglang.layers.quantization.fp8_kernels import fp8_linear, quantize_rows

    gemm, serves = small_m_gemm._fp8_channel_gemm
    assert gemm is fp8_linear and serves is fp8.scaled_mm_supported
    torch.manual_seed(0)
    x = 4 * torch.randn(3, 64, dtype=torch.bfloat16)  # rms 4: a skipped norm shows
    w, scale = quantize_rows(torch.randn(128, 64))
    # on CPU _scaled_mm does not serve, so the pick leaves the GEMV nothing to beat
    kwargs = small_m_gemm._variant_kwargs(x, w, ("fp8",))
    assert small_m_gemm._fp8_fallback(x, w, kwargs) is None
    monkeypatch.setattr(small_m_gemm, "_fp8_channel_gemm", (gemm, lambda x, w: True))
    wf = (w.float() * scale[:, None]).to(torch.bfloat16)
    cases = {
        ("fp8",): lambda kw: F.linear(x, wf),
        ("norm", "fp8"): lambda kw: F.linear(F.rms_norm(x, (64,), eps=kw["eps"]), wf),
        ("residual", "fp8"): lambda kw: F.linear(x, wf) + 1,
        ("silu_mul", "fp8"): lambda kw: F.silu(F.linear(x, wf[:64])) * F.linear(x, wf[64:]),
    }
    for variant, reference in cases.items():
        kwargs = small_m_gemm._variant_kwargs(x, w, variant)
        kwargs["w_scale"] = scale
        if "residual" in kwargs:
            kwargs["residual"] += 1
        expected = reference(kwargs).float()
        out = small_m_gemm._fp8_fallback(x, w, kwargs)().float()
        # x is quantized per token on this path: FP8's relative error
        assert out.shape == expected.shape, variant
        assert (out - expected).abs().max() < 0.1 * expected.abs().max(), variant

"""The RoPE cos/sin cache of every scaled rope type against SGLang 0.5.4's formulas
(srt/layers/rotary_embedding.py), each written out here in float64 per position and
frequency pair, independently of mini_sglang's code.

Dynamic NTK is the one where transformers differs: it keeps the unscaled frequencies up to
max_position_embeddings and recomputes them per sequence length beyond, while SGLang
computes them once, for max_position_embeddings x factor positions; the cache must be
SGLang's.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig

from mini_sglang.layers.rotary_embedding import get_rope

HEAD_DIM = 16
MAX_POS = 64
BASE = 10000.0
ATOL = 1e-4  # float32 angles up to a few hundred radians


def _config(rope_scaling: dict | None) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POS,
        rope_theta=BASE,
        rope_scaling=rope_scaling,
    )


def _base_inv(base: float) -> list[float]:
    return [base ** (-(2 * i) / HEAD_DIM) for i in range(HEAD_DIM // 2)]


def _row(position: float, inv: list[float], mscale: float = 1.0) -> torch.Tensor:
    angles = [position * f for f in inv]
    cos = [math.cos(a) * mscale for a in angles]
    sin = [math.sin(a) * mscale for a in angles]
    return torch.tensor(cos + sin, dtype=torch.float64)


def _check(rope_scaling: dict, rows: int, want_row) -> torch.Tensor:
    cache = get_rope(_config(rope_scaling), HEAD_DIM, MAX_POS).cos_sin_cache
    assert cache.shape == (rows, HEAD_DIM)
    for p in sorted({0, 1, 7, MAX_POS - 1, min(MAX_POS, rows - 1), rows - 1}):
        torch.testing.assert_close(cache[p].double(), want_row(p), atol=ATOL, rtol=0)
    return cache


@pytest.mark.parametrize("key", ["rope_type", "type"])
def test_dynamic_ntk_is_sglangs_fixed_base(key):
    factor = 4.0
    # DynamicNTKScalingRotaryEmbedding: max_len = max_pos * factor and
    # base' = base * (factor * max_len / max_pos - (factor - 1)) ** (d / (d - 2))
    base = BASE * (factor * factor - (factor - 1)) ** (HEAD_DIM / (HEAD_DIM - 2))
    inv = _base_inv(base)
    cache = _check(
        {key: "dynamic", "factor": factor}, int(MAX_POS * factor), lambda p: _row(p, inv)
    )
    # transformers' init (the unscaled base up to max_position_embeddings) is far from it
    hf = _row(MAX_POS - 1, _base_inv(BASE))
    assert (cache[MAX_POS - 1].double() - hf).abs().max() > 0.1


def test_dynamic_ntk_alpha():
    # DynamicNTKAlphaRotaryEmbedding: base' = base * alpha ** (d / (d - 2))
    inv = _base_inv(BASE * 3.0 ** (HEAD_DIM / (HEAD_DIM - 2)))
    _check(
        {"rope_type": "dynamic", "factor": 2.0, "alpha": 3.0}, 2 * MAX_POS, lambda p: _row(p, inv)
    )


def test_linear_divides_positions():
    inv = _base_inv(BASE)
    _check({"rope_type": "linear", "factor": 3.0}, 3 * MAX_POS, lambda p: _row(p / 3.0, inv))


def test_llama3_frequency_bands():
    factor, low, high, original = 8.0, 1.0, 4.0, 16
    want = []
    for f in _base_inv(BASE):
        wave = 2 * math.pi / f
        if wave < original / high:
            want.append(f)
        elif wave > original / low:
            want.append(f / factor)
        else:
            smooth = (original / wave - low) / (high - low)
            want.append((1 - smooth) * f / factor + smooth * f)
    assert len(set(want) - set(_base_inv(BASE))) > 1  # the bands really move frequencies
    params = {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": high,
        "original_max_position_embeddings": original,
    }
    _check(params, MAX_POS, lambda p: _row(p, want))


def test_yarn_with_sglangs_attn_and_extrapolation_factors():
    factor, original, attn_factor, extrapolation = 4.0, 32, 0.9, 0.5
    beta_fast, beta_slow = 32, 1

    def correction_dim(rotations):
        return HEAD_DIM * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(BASE))

    lo = max(math.floor(correction_dim(beta_fast)), 0)
    hi = min(math.ceil(correction_dim(beta_slow)), HEAD_DIM - 1)
    inv = []
    for i, f in enumerate(_base_inv(BASE)):
        ramp = min(max((i - lo) / (hi - lo), 0.0), 1.0)
        mask = (1 - ramp) * extrapolation
        inv.append(f / factor * (1 - mask) + f * mask)
    mscale = (0.1 * math.log(factor) + 1.0) * attn_factor
    params = {
        "rope_type": "yarn",
        "factor": factor,
        "original_max_position_embeddings": original,
        "attn_factor": attn_factor,
        "extrapolation_factor": extrapolation,
    }
    # SGLang's cache covers original x factor positions; at least max_position here
    _check(params, max(MAX_POS, int(original * factor)), lambda p: _row(p, inv, mscale))


def test_longrope_short_and_long_caches_and_the_batch_rule():
    original, half = 16, HEAD_DIM // 2
    short = [1.0 + 0.1 * i for i in range(half)]
    long = [1.0 + 2.0 * i for i in range(half)]
    params = {
        "rope_type": "longrope",
        "original_max_position_embeddings": original,
        "short_factor": short,
        "long_factor": long,
    }
    rope = get_rope(_config(params), HEAD_DIM, MAX_POS)
    # Phi3LongRoPEScaledRotaryEmbedding: mscale from max_position / original
    mscale = math.sqrt(1 + math.log(MAX_POS / original) / math.log(original))
    base_inv = _base_inv(BASE)
    short_inv = [f / s for f, s in zip(base_inv, short)]
    long_inv = [f / s for f, s in zip(base_inv, long)]
    cache = rope.cos_sin_cache
    assert cache.shape == (original + MAX_POS, HEAD_DIM)
    for p in (0, 5, original - 1):
        torch.testing.assert_close(cache[p].double(), _row(p, short_inv, mscale), atol=ATOL, rtol=0)
    for p in (0, 5, original, MAX_POS - 1):
        want = _row(p, long_inv, mscale)
        torch.testing.assert_close(cache[original + p].double(), want, atol=ATOL, rtol=0)
    # A batch reads the long rows for every token once any position reaches `original`.
    short_batch = torch.tensor([0, 3, original - 1])
    assert rope.cache_rows(short_batch).tolist() == short_batch.tolist()
    mixed = torch.tensor([0, 3, original])
    assert rope.cache_rows(mixed).tolist() == (mixed + original).tolist()

"""Rotary position embedding (neox / rotate-half layout, as HF Llama, Qwen2 and Qwen3 use).

The cos/sin cache follows SGLang 0.5.4's rope classes (srt/layers/rotary_embedding.py),
formula for formula, for the rope types SGLang knows: default, linear, dynamic (NTK, and
its `alpha` variant), yarn, llama3 and longrope. Other types take their inverse
frequencies from transformers' rope-init functions. cos/sin are cached for every position
up to cache_positions(...).

Models index the cache with `rotary_emb.cache_rows(positions)`, the positions themselves
for every type but longrope (LongRopeRotaryEmbedding: a short-factor and a long-factor
cache, chosen per batch).

Dynamic NTK differs from transformers on purpose: transformers recomputes the frequencies
from each sequence's length (unscaled up to max_position_embeddings, a growing base
beyond), while SGLang computes them once, with the base stretched for the longest sequence
(max_position_embeddings x factor), and uses them for every position; a server whose cache
holds K of many lengths cannot re-rotate it per length.

M-RoPE (Qwen2-VL / Qwen2.5-VL, `mrope_section` in the rope parameters) gives each token three
positions (temporal, height, width); frequency pair i takes its angle from the position of
the section it falls in. `MRotaryEmbedding.cos_sin_rows` turns [3, T] positions into one
cos/sin row per token, laid out like the cache; the attention then indexes those rows with
positions 0..T-1, so every RoPE kernel (plain, flashinfer, the fused q/k-norm-RoPE-store)
serves M-RoPE unchanged. Where a token's three positions are equal (text, and every decode
token) its row is the cache's row of that position, so such tokens need no rows at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from mini_sglang.layers.kernels import flashinfer_module


def _rope_parameters(hf_config) -> dict:
    params = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None)
    params = dict(params or {})
    params.setdefault("rope_theta", getattr(hf_config, "rope_theta", None) or 10000.0)
    params["rope_type"] = params.get("rope_type", params.get("type", "default")) or "default"
    return params


@dataclass(frozen=True)
class RopeFrequencies:
    """A rope type's cache recipe: angle(position p, pair i) = (p / position_divisor) *
    inv_freq[i]; cos and sin are multiplied by `scaling` (YaRN's mscale, 1.0 elsewhere)."""

    inv_freq: torch.Tensor
    scaling: float = 1.0
    position_divisor: float = 1.0


def _base_inv_freq(base: float, dim: int) -> torch.Tensor:
    """SGLang's RotaryEmbedding._compute_inv_freq."""
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))


def _dynamic_ntk_base(params: dict, dim: int, max_position: int) -> float:
    """SGLang's DynamicNTKScalingRotaryEmbedding (the base for max_position x factor
    positions) or, with `alpha`, DynamicNTKAlphaRotaryEmbedding."""
    base = params["rope_theta"]
    if params.get("alpha") is not None:
        return base * params["alpha"] ** (dim / (dim - 2))
    factor = params["factor"]
    max_len = max_position * factor
    return base * ((factor * max_len / max_position) - (factor - 1)) ** (dim / (dim - 2))


def _given(params: dict, key: str, default: float) -> float:
    """params[key], or `default` where the key is absent or null."""
    value = params.get(key)
    return default if value is None else value


def _yarn(params: dict, dim: int, max_position: int) -> RopeFrequencies:
    """SGLang's YaRNScalingRotaryEmbedding: its keys (attn_factor multiplies the mscale,
    extrapolation_factor, beta_fast / beta_slow), not transformers' attention_factor."""
    base, factor = params["rope_theta"], params["factor"]
    original = params.get("original_max_position_embeddings") or max_position
    beta_fast, beta_slow = _given(params, "beta_fast", 32), _given(params, "beta_slow", 1)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001  # as SGLang: no zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)
    inv_extrapolation = 1.0 / pos_freqs
    inv_interpolation = 1.0 / (factor * pos_freqs)
    mask = (1 - ramp) * _given(params, "extrapolation_factor", 1)
    inv_freq = inv_interpolation * (1 - mask) + inv_extrapolation * mask
    mscale = 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0
    return RopeFrequencies(inv_freq, float(mscale * _given(params, "attn_factor", 1)))


def _llama3(params: dict, dim: int) -> torch.Tensor:
    """SGLang's Llama3RotaryEmbedding._compute_inv_freq."""
    inv = _base_inv_freq(params["rope_theta"], dim)
    factor = params["factor"]
    low_factor, high_factor = params["low_freq_factor"], params["high_freq_factor"]
    original = params["original_max_position_embeddings"]
    low_wavelen, high_wavelen = original / low_factor, original / high_factor
    wave_len = 2 * math.pi / inv
    smooth = (
        (original / wave_len - low_factor) / (high_factor - low_factor)
        if low_factor != high_factor
        else 0
    )
    return torch.where(
        wave_len < high_wavelen,
        inv,
        torch.where(
            wave_len > low_wavelen, inv / factor, (1 - smooth) * inv / factor + smooth * inv
        ),
    )


def rope_frequencies(hf_config, head_dim: int, max_position: int) -> RopeFrequencies:
    """The cache recipe of the config's rope type for a model of max_position_embeddings
    `max_position` (SGLang's formulas; transformers' for types SGLang lacks)."""
    params = _rope_parameters(hf_config)
    rope_type = params["rope_type"]
    if rope_type == "default":
        return RopeFrequencies(_base_inv_freq(params["rope_theta"], head_dim))
    if rope_type == "linear":
        inv = _base_inv_freq(params["rope_theta"], head_dim)
        return RopeFrequencies(inv, position_divisor=params["factor"])
    if rope_type == "dynamic":
        base = _dynamic_ntk_base(params, head_dim, max_position)
        return RopeFrequencies(_base_inv_freq(base, head_dim))
    if rope_type == "yarn":
        return _yarn(params, head_dim, max_position)
    if rope_type == "llama3":
        return RopeFrequencies(_llama3(params, head_dim))
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(
            f"Unsupported rope_type {rope_type!r}; supported: default, {', '.join(ROPE_INIT_FUNCTIONS)}"
        )
    inv, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_config, "cpu")
    return RopeFrequencies(inv.float(), float(scaling))


def compute_inv_freq(hf_config, head_dim: int) -> tuple[torch.Tensor, float]:
    """(inverse frequencies per unit of position [head_dim // 2], attention scaling) for
    the config's rope type and its max_position_embeddings."""
    max_position = getattr(hf_config, "max_position_embeddings", None) or 2048
    f = rope_frequencies(hf_config, head_dim, max_position)
    return f.inv_freq / f.position_divisor, f.scaling


# head sizes flashinfer's fused RoPE kernel is compiled for
FLASHINFER_ROPE_HEAD_DIMS = (64, 128, 256)


class RotaryEmbedding(nn.Module):
    """Applies RoPE to q and k of shape [num_tokens, num_heads * head_dim] in place-free form."""

    def __init__(
        self,
        head_dim: int,
        max_position: int,
        inv_freq: torch.Tensor,
        scaling: float,
        position_divisor: float = 1.0,
    ):
        """cos/sin of (p / position_divisor) * inv_freq for p < max_position, times
        `scaling` (RopeFrequencies' recipe; SGLang divides positions, not frequencies, for
        linear scaling)."""
        super().__init__()
        self.head_dim = head_dim
        t = torch.arange(max_position, dtype=torch.float32)
        if position_divisor != 1.0:
            t = t / position_divisor
        freqs = torch.einsum("i,j -> ij", t, inv_freq.to(t.device))
        # [max_position, head_dim]: cos in the first half, sin in the second (flashinfer layout).
        cache = torch.cat([freqs.cos() * scaling, freqs.sin() * scaling], dim=-1)
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def cache_rows(self, positions: torch.Tensor) -> torch.Tensor:
        """The cache rows a batch's `positions` read: the positions themselves."""
        return positions

    def forward_native(
        self,
        positions: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        cos_sin_cache: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        half = self.head_dim // 2
        cache = self.cos_sin_cache if cos_sin_cache is None else cos_sin_cache
        cos, sin = cache[positions].chunk(2, dim=-1)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)

        def rotate(x: torch.Tensor) -> torch.Tensor:
            shape = x.shape
            x = x.view(shape[0], -1, self.head_dim).float()
            x1, x2 = x[..., :half], x[..., half:]
            out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
            return out.view(shape)

        return rotate(q).to(q.dtype), rotate(k).to(k.dtype)

    def forward(
        self,
        positions: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        cos_sin_cache: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE of q and k at `positions`, read from `cos_sin_cache` (default: this module's
        cache; M-RoPE passes its per-token rows, see MRotaryEmbedding.cos_sin_rows)."""
        cache = self.cos_sin_cache if cos_sin_cache is None else cos_sin_cache
        fi = flashinfer_module() if q.is_cuda else None
        if fi is None or self.head_dim not in FLASHINFER_ROPE_HEAD_DIMS:
            return self.forward_native(positions, q, k, cache)
        q, k = q.contiguous(), k.contiguous()
        fi.rope.apply_rope_with_cos_sin_cache_inplace(
            positions=positions,
            query=q,
            key=k,
            head_size=self.head_dim,
            cos_sin_cache=cache,
            is_neox=True,
        )
        return q, k


class MRotaryEmbedding(RotaryEmbedding):
    """RoPE with multimodal sections (SGLang's MRotaryEmbedding, non-interleaved):
    `mrope_section` [s_t, s_h, s_w] sums to head_dim // 2; frequency pairs 0..s_t-1 rotate
    by the temporal position, the next s_h by the height position, the last s_w by the
    width position."""

    def __init__(
        self,
        head_dim: int,
        max_position: int,
        inv_freq: torch.Tensor,
        scaling: float,
        mrope_section: list[int],
        position_divisor: float = 1.0,
    ):
        super().__init__(head_dim, max_position, inv_freq, scaling, position_divisor)
        if sum(mrope_section) != head_dim // 2:
            raise ValueError(
                f"mrope_section {mrope_section} must sum to head_dim // 2 = {head_dim // 2}"
            )
        self.mrope_section = list(mrope_section)

    def cos_sin_rows(self, positions: torch.Tensor) -> torch.Tensor:
        """float32 [T, head_dim] cos/sin rows (cache layout) for [3, T] M-RoPE positions."""
        cos, sin = self.cos_sin_cache[positions].chunk(2, dim=-1)  # each [3, T, head_dim // 2]

        def pick(x: torch.Tensor) -> torch.Tensor:
            parts = x.split(self.mrope_section, dim=-1)
            return torch.cat([part[i] for i, part in enumerate(parts)], dim=-1)

        return torch.cat([pick(cos), pick(sin)], dim=-1)


class LongRopeRotaryEmbedding(RotaryEmbedding):
    """SGLang's Phi3LongRoPEScaledRotaryEmbedding: a cache of `original` rows with the
    short factors followed by one of `max_position` rows with the long factors (inverse
    frequency i is 1 / (factor[i] * base^(2i/d)); cos/sin times the short / long mscale,
    by default sqrt(1 + ln(max_position / original) / ln(original))). A batch reads the
    long rows, for every token, when any of its positions reaches `original`, else the
    short ones.

    SGLang switches when a position exceeds `original` and otherwise reads row `original`
    (which is the long cache's position 0) for a token at exactly that position; here such
    a batch reads the long rows, as transformers does for a sequence longer than
    `original`."""

    def __init__(self, head_dim: int, max_position: int, params: dict):
        original = params["original_max_position_embeddings"]
        scale = max_position / original
        default_mscale = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1.0 else 1.0
        short_mscale = params.get("short_mscale")
        long_mscale = params.get("long_mscale")
        short_mscale = default_mscale if short_mscale is None else short_mscale
        long_mscale = default_mscale if long_mscale is None else long_mscale
        shape = torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim

        def inv(factors: list[float]) -> torch.Tensor:
            return 1.0 / (
                torch.tensor(factors, dtype=torch.float32) * params["rope_theta"] ** shape
            )

        short = RotaryEmbedding(head_dim, original, inv(params["short_factor"]), short_mscale)
        super().__init__(head_dim, max_position, inv(params["long_factor"]), long_mscale)
        self.original = original
        self.cos_sin_cache = torch.cat([short.cos_sin_cache, self.cos_sin_cache], dim=0)

    def cache_rows(self, positions: torch.Tensor) -> torch.Tensor:
        """positions, or positions + original (the long rows) for all tokens when any
        reaches original; computed on the device without a sync (CUDA-graph safe)."""
        long = (positions >= self.original).any().to(positions.dtype)
        return positions + long * self.original


def cache_positions(params: dict, max_position: int) -> int:
    """Positions the cos/sin cache must hold for rope parameters `params` and the config's
    max_position_embeddings, as SGLang's scaled rope classes size theirs: linear and dynamic
    scaling serve max_position x factor positions, YaRN original_max_position_embeddings x
    factor; other types max_position. Never fewer than max_position, so the context length
    ModelConfig derives (which stretches max_position by the same factor) always fits."""
    factor = float(params.get("factor") or 1.0)
    rope_type = params["rope_type"]
    if rope_type in ("linear", "dynamic"):
        return max(max_position, int(max_position * factor))
    if rope_type == "yarn":
        original = params.get("original_max_position_embeddings") or max_position
        return max(max_position, int(original * factor))
    return max_position


def get_rope(hf_config, head_dim: int, max_position: int) -> RotaryEmbedding:
    """The config's RoPE: MRotaryEmbedding when its rope parameters carry `mrope_section`.
    The cache holds cache_positions(...) positions (at least `max_position`)."""
    params = _rope_parameters(hf_config)
    if params["rope_type"] == "longrope":
        return LongRopeRotaryEmbedding(head_dim, max_position, params)
    f = rope_frequencies(hf_config, head_dim, max_position)
    positions = cache_positions(params, max_position)
    section = params.get("mrope_section")
    if section:
        return MRotaryEmbedding(
            head_dim, positions, f.inv_freq, f.scaling, section, f.position_divisor
        )
    return RotaryEmbedding(head_dim, positions, f.inv_freq, f.scaling, f.position_divisor)

"""FP8 linear methods and the configs that choose them (and, for MoE layers, the FP8
expert method of fp8_moe.py).

- `fp8` (SGLang's Fp8Config): `--quantization fp8` on a bf16/fp16 checkpoint quantizes
  each weight to float8_e4m3fn while it loads, one scale per output channel (online); an
  FP8 checkpoint (`quantization_config.quant_method == "fp8"`) has its weights already in
  FP8, with a per-tensor `weight_scale` or, with `weight_block_size` [bn, bk], a block-wise
  `weight_scale_inv` [N / bn, K / bk] (DeepSeek / Qwen3-FP8 format).
- `compressed-tensors` with FP8 weights (`config_groups.*.weights`: 8-bit float, strategy
  `channel` or `tensor`; the Llama-3.1-8B-Instruct-FP8 formats), `ignore` listing the
  layers left unquantized (names, or `re:` regular expressions).

Activations are quantized dynamically (per token, or per token and group of bk columns for
block-wise weights; the small-batch GEMV reads them unquantized); a checkpoint's static
`input_scale` is not used. A
per-tensor weight scale is stored per channel (the shard's scale on each of its rows), so
fused q/k/v and gate/up layers whose projections have different scales need no
re-quantization. The LM head, embeddings and MoE routers (`gate`) are never quantized.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from mini_sglang.environ import envs
from mini_sglang.layers import small_m_gemm
from mini_sglang.layers.moe import fused_moe_gemv
from mini_sglang.layers.moe.method import FusedMoEMethodBase, UnquantizedFusedMoEMethod
from mini_sglang.layers.parameter import make_param
from mini_sglang.layers.quantization.base import LinearMethodBase, QuantizationConfig
from mini_sglang.layers.quantization.fp8_kernels import (
    FP8_DTYPE,
    block_fp8_linear,
    dequantize_blocks,
    dequantize_rows,
    fp8_linear,
    fp8_linear_quantized,
    quantize_blocks,
    quantize_rows,
    rmsnorm_per_token_quant,
    scaled_mm_supported,
    silu_mul_per_token_quant,
    triton_fp8_supported,
)
from mini_sglang.layers.quantization.fp8_moe import Fp8MoEMethod
from mini_sglang.layers.quantization.methods import QuantSpec
from mini_sglang.layers.quantization.unquantized import UnquantizedLinearMethod

if TYPE_CHECKING:
    from mini_sglang.layers.layernorm import RMSNorm

# Fp8LinearMethod.apply's GEMM where the small-M GEMV pick is None: the pick times it
# against the GEMV configs.
small_m_gemm.register_fp8_channel_gemm(fp8_linear, scaled_mm_supported)

# A fused layer's checkpoint projections: a layer is left unquantized only if all of its
# projections are (a fused weight has one precision).
_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def _matches(name: str, pattern: str) -> bool:
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    return name == pattern


def is_layer_ignored(prefix: str, ignored: list[str]) -> bool:
    """Whether the linear layer `prefix` (our fused name, e.g. model.layers.0.mlp.gate_up_proj)
    is in `ignored` (checkpoint names); raises ValueError if only some of a fused layer's
    projections are."""
    if not ignored:
        return False
    head, _, last = prefix.rpartition(".")
    names = [f"{head}.{part}" for part in _FUSED[last]] if last in _FUSED else [prefix]
    flags = [any(_matches(n, p) for p in ignored) for n in names]
    if any(flags) and not all(flags):
        raise ValueError(
            f"{prefix}: some of its projections are in ignored_layers and some are not; the "
            "projections of a fused layer must share one precision"
        )
    return all(flags)


class _Fp8GemvFusions(LinearMethodBase):
    """The small-M GEMV's fusions (small_m_gemm: the input RMSNorm, the SiLU-mul and both
    together folded into the GEMV) for an FP8 method, given where its GEMV serves x
    (_gemv_fits) and the weight's scales (_scales: per row, or per block with the block)."""

    def _gemv_fits(self, x: torch.Tensor) -> bool:
        raise NotImplementedError

    def _scales(self, layer: nn.Module) -> tuple[torch.Tensor, tuple[int, int] | None]:
        raise NotImplementedError

    def apply_rmsnorm(
        self, layer: nn.Module, x: torch.Tensor, norm: RMSNorm
    ) -> torch.Tensor | None:
        if not self._gemv_fits(x):
            return None
        scale, block = self._scales(layer)
        return small_m_gemm.linear_rmsnorm(
            x, layer.weight, norm.weight.data, norm.variance_epsilon, w_scale=scale, w_block=block
        )

    def apply_silu_mul(
        self, layer: nn.Module, x: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor | None:
        if not self._gemv_fits(x):
            return None
        return small_m_gemm.linear_silu_mul(x, layer.weight, *self._scales(layer))

    def rmsnorm_silu_mul_fold(
        self, layer: nn.Module, x: torch.Tensor, norm: RMSNorm
    ) -> Callable[[torch.Tensor], torch.Tensor] | None:
        if not self._gemv_fits(x):
            return None
        scale, block = self._scales(layer)
        return small_m_gemm.rmsnorm_silu_mul_fold(
            x, layer.weight, norm.weight.data, norm.variance_epsilon, w_scale=scale, w_block=block
        )


class Fp8LinearMethod(_Fp8GemvFusions):
    """weight [N, K] float8_e4m3fn with weight_scale [N] float32 (one per output row).

    A weight tensor of another dtype loaded into it (a bf16 checkpoint, an online update) is
    quantized per row as it loads (quantize_rows); with `online` the checkpoint has no
    weight_scale, so the loader need not find one. On CUDA at batches up to
    small_m_gemm.MAX_M the Triton GEMV reads the FP8 weight and applies the scale in its
    epilogue (activations unquantized), with the same norm / SiLU / residual fusions as
    the unquantized method; larger batches quantize x per token and run
    fp8_kernels.fp8_linear."""

    def __init__(self, online: bool) -> None:
        self.online = online
        # read once at model build, not per layer call (see apply_add_rmsnorm)
        self.fuse_input_quant = envs.MINI_SGLANG_FP8_NORM_QUANT.get()

    def create_weights(
        self,
        layer: nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
    ) -> None:
        n = sum(output_partition_sizes)
        scale = make_param(
            layer, "weight_scale", torch.ones(n, dtype=torch.float32), input_dim=None
        )
        scale.loaded_with_weight = self.online
        make_param(
            layer,
            "weight",
            torch.empty((n, input_size_per_partition), dtype=FP8_DTYPE),
            quantize_into=scale,
            quantize=quantize_rows,
        )

    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        out = None
        if triton_fp8_supported(x):  # the GEMV reads FP8 where Triton can
            out = small_m_gemm.linear_scaled(x, layer.weight, layer.weight_scale)
        if out is None:
            return fp8_linear(x, layer.weight, layer.weight_scale, bias)
        return out + bias if bias is not None else out

    def dequantized_weight(self, layer: nn.Module) -> torch.Tensor:
        return dequantize_rows(layer.weight.data, layer.weight_scale.data)

    def _gemv_fits(self, x: torch.Tensor) -> bool:
        return triton_fp8_supported(x)  # small_m_gemm itself declines CPU and large batches

    def _scales(self, layer: nn.Module) -> tuple[torch.Tensor, None]:
        return layer.weight_scale, None

    def apply_add_(self, layer: nn.Module, x: torch.Tensor, residual: torch.Tensor) -> bool:
        if not triton_fp8_supported(x):
            return False
        return small_m_gemm.linear_add_(x, layer.weight, residual, layer.weight_scale)

    def apply_add_rmsnorm(
        self, layer: nn.Module, x: torch.Tensor, residual: torch.Tensor, norm: RMSNorm
    ) -> torch.Tensor | None:
        # Above the GEMV's batch sizes x is quantized per token for torch._scaled_mm anyway:
        # the norm kernel writes FP8 and the scales straight away (one launch and one
        # [M, K] write and read less per norm; MINI_SGLANG_FP8_NORM_QUANT=0 turns it off).
        if not (self.fuse_input_quant and _input_quant_fits(x) and residual.is_contiguous()):
            return None
        xq, xs = rmsnorm_per_token_quant(x, norm.weight.data, norm.variance_epsilon, residual)
        return fp8_linear_quantized(xq, xs, layer.weight, layer.weight_scale, x.dtype)

    def apply_after_silu_mul(self, layer: nn.Module, gate_up: torch.Tensor) -> torch.Tensor | None:
        # as apply_add_rmsnorm: the SiLU-mul kernel writes FP8 and the scales
        if not (self.fuse_input_quant and _input_quant_fits(gate_up)):
            return None
        xq, xs = silu_mul_per_token_quant(gate_up)
        return fp8_linear_quantized(xq, xs, layer.weight, layer.weight_scale, gate_up.dtype)


def _input_quant_fits(x: torch.Tensor) -> bool:
    """Whether the kernel before an FP8 linear can quantize x for it: above the GEMV's batch
    sizes, where Triton writes FP8."""
    return (
        x.dim() == 2
        and x.shape[0] > small_m_gemm.MAX_M
        and triton_fp8_supported(x)
        and x.is_contiguous()
    )


# The most rows Fp8BlockLinearMethod sends to fused_moe_gemv.block_fp8_gemv: its grid has
# programs per row, each streaming the weight again (from L2 after the first), where the
# block matmul reads it once for every row.
BLOCK_GEMV_MAX_M = 4


def _block_gemv_fits(x: torch.Tensor) -> bool:
    """Whether block_fp8_gemv serves x: CUDA with Triton's FP8, 16-bit x of at most
    BLOCK_GEMV_MAX_M rows."""
    return (
        x.dim() == 2
        and x.shape[0] <= BLOCK_GEMV_MAX_M
        and x.dtype in (torch.bfloat16, torch.float16)
        and triton_fp8_supported(x)
    )


class Fp8BlockLinearMethod(_Fp8GemvFusions):
    """weight [N, K] float8_e4m3fn with weight_scale_inv [ceil(N / bn), ceil(K / bk)]
    float32, one scale per (bn, bk) block. Up to BLOCK_GEMV_MAX_M rows on CUDA the GEMV of
    fused_moe_gemv.block_fp8_gemv dequantizes the weight as it streams it (x unquantized,
    as the per-channel method's GEMV) and may add into the residual (apply_add_); at one
    row small_m_gemm's persistent GEMV serves instead where its start-up pick times it
    faster, with the input norm, the SiLU-mul or the residual add folded in as for the
    other methods; larger batches quantize x per token and group of bk columns
    (fp8_kernels.block_fp8_linear).
    Every projection of a fused layer, and every rank's shard, must start on a block
    boundary. A tensor of another dtype loaded into the weight (an online update from an
    unquantized model) is quantized block by block."""

    def __init__(self, block: tuple[int, int]) -> None:
        self.block = block

    def create_weights(
        self,
        layer: nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
    ) -> None:
        bn, bk = self.block
        if input_size_per_partition != input_size and input_size_per_partition % bk:
            raise ValueError(
                f"FP8 weight_block_size {list(self.block)}: the rank's {input_size_per_partition} "
                "input features are not whole blocks; use a smaller --tp-size"
            )
        n = sum(output_partition_sizes)
        scale = make_param(
            layer,
            "weight_scale_inv",
            torch.ones((-(-n // bn), -(-input_size_per_partition // bk)), dtype=torch.float32),
            block_size=self.block,
        )
        make_param(
            layer,
            "weight",
            torch.empty((n, input_size_per_partition), dtype=FP8_DTYPE),
            quantize_into=scale,
            quantize=functools.partial(quantize_blocks, block=self.block),
        )

    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        if _block_gemv_fits(x):
            w, scale = layer.weight, layer.weight_scale_inv
            out = small_m_gemm.linear_scaled(x, w, scale, self.block)
            if out is None:
                out = fused_moe_gemv.block_fp8_gemv(x, w, scale, self.block)
            return out + bias if bias is not None else out
        return block_fp8_linear(x, layer.weight, layer.weight_scale_inv, self.block, bias)

    def _gemv_fits(self, x: torch.Tensor) -> bool:
        return _block_gemv_fits(x)

    def _scales(self, layer: nn.Module) -> tuple[torch.Tensor, tuple[int, int]]:
        return layer.weight_scale_inv, self.block

    def apply_add_(self, layer: nn.Module, x: torch.Tensor, residual: torch.Tensor) -> bool:
        if not (_block_gemv_fits(x) and residual.dtype == x.dtype and residual.stride(1) == 1):
            return False
        w, scale = layer.weight, layer.weight_scale_inv
        if not small_m_gemm.linear_add_(x, w, residual, scale, self.block):
            fused_moe_gemv.block_fp8_gemv(x, w, scale, self.block, residual=residual)
        return True

    def dequantized_weight(self, layer: nn.Module) -> torch.Tensor:
        return dequantize_blocks(layer.weight.data, layer.weight_scale_inv.data, self.block)


_UNQUANTIZED = UnquantizedLinearMethod()
_UNQUANTIZED_MOE = UnquantizedFusedMoEMethod()


@dataclass
class Fp8Config(QuantizationConfig):
    """The linear methods of an `fp8` or FP8 `compressed-tensors` model (see QuantSpec)."""

    spec: QuantSpec

    @property
    def name(self) -> str:
        return self.spec.method

    def get_linear_method(self, prefix: str) -> LinearMethodBase:
        if is_layer_ignored(prefix, list(self.spec.ignored_layers)):
            return _UNQUANTIZED
        if self.spec.weight_block_size is not None:
            return Fp8BlockLinearMethod(self.spec.weight_block_size)
        return Fp8LinearMethod(online=not self.spec.checkpoint_fp8)

    def get_moe_method(self, prefix: str) -> FusedMoEMethodBase:
        """FP8 experts in the model's format (fp8_moe.py); unquantized if `prefix` (the
        FusedMoE module, e.g. model.layers.0.mlp.experts) is in ignored_layers."""
        if is_layer_ignored(prefix, list(self.spec.ignored_layers)):
            return _UNQUANTIZED_MOE
        return Fp8MoEMethod(self.spec.weight_block_size, online=not self.spec.checkpoint_fp8)

"""FP8 experts for FusedMoE (SGLang's Fp8MoEMethod), chosen by Fp8Config.get_moe_method.

Parameters of a layer (E local experts, H hidden, I this rank's intermediate shard):
- w13_weight [E, 2I, H] and w2_weight [E, H, I], float8_e4m3fn;
- per channel: w13_weight_scale [E, 2I] and w2_weight_scale [E, H] float32, one scale per
  output row of each expert. `--quantization fp8` on a bf16/fp16 checkpoint quantizes every
  expert's projections this way while they load (online); an FP8 checkpoint's per-tensor
  `weight_scale` (or compressed-tensors' per-channel [N, 1] one) is stored the same way,
  repeated on the rows of its projection, so gate and up keep their own scales;
- block-wise (`weight_block_size` [bn, bk], Qwen3-30B-A3B-FP8 / DeepSeek): w13_weight_scale_inv
  [E, 2I / bn, ceil(H / bk)] and w2_weight_scale_inv [E, ceil(H / bn), ceil(I / bk)], the
  checkpoint's per-expert `weight_scale_inv` tensors stacked; I must be whole bn blocks (gate
  and up each own their scale rows), and at TP > 1 whole bk blocks (the w2 column split).

Activations are quantized dynamically: per token (per channel), or per token and group of
bk columns (block-wise), both x and the SiLU-and-mul output. On CUDA sm89+ the fused Triton
kernels run w8a8 (fused_moe_triton.Fp8Experts); on older GPUs the same kernels get the FP8
values converted to the model dtype (exact, but the weights are converted at every call:
correct and CUDA-graph safe rather than fast); on the CPU the experts are dequantized and
the torch reference runs with the same activation quantization. These paths compute the
same function up to summation order. Batches of a few tokens on CUDA take the expert GEMVs
(fused_moe_gemv), which dequantize the weights as they read them and leave the
activations unquantized, as the dense FP8 GEMV does. A checkpoint's static `input_scale`
is not used.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from mini_sglang.layers.kernels import triton
from mini_sglang.layers.moe.experts_torch import fused_experts_torch
from mini_sglang.layers.moe.fused_moe_triton import Fp8Experts, fused_experts_triton
from mini_sglang.layers.moe.method import FusedMoEMethodBase
from mini_sglang.layers.parameter import make_param
from mini_sglang.layers.quantization.fp8_kernels import (
    FP8_DTYPE,
    dequantize_blocks,
    dequantize_rows,
    per_token_group_quant,
    per_token_quant,
    quantize_blocks,
    quantize_rows,
    triton_fp8_supported,
)


def quantize_activations(x: torch.Tensor, group: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (fp8 [M, K], scale [M, 1] per token, or [M, ceil(K / group)] per token
    and group of `group` columns)."""
    return per_token_quant(x) if group is None else per_token_group_quant(x, group)


def quantize_activations_in(
    x: torch.Tensor, group: int | None, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_activations with the FP8 values held in `dtype` (bf16 and fp16 hold every
    float8_e4m3fn value exactly), for GPUs whose Triton has no FP8 dot."""
    q, scale = quantize_activations(x, group)
    return q.to(dtype), scale


def qdq_activations(x: torch.Tensor, group: int | None) -> torch.Tensor:
    """x quantized as quantize_activations does and dequantized (float32)."""
    q, scale = quantize_activations(x, group)
    return dequantize_rows(q, scale) if group is None else dequantize_blocks(q, scale, (1, group))


def quantize_experts(
    w: torch.Tensor, block: tuple[int, int] | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert weights w [E, N, K] -> (fp8 [E, N, K], scales) in Fp8MoEMethod's layout:
    [E, N] per output row (`block` None) or [E, ceil(N / bn), ceil(K / bk)] per block."""
    if block is None:
        q, s = quantize_rows(w.reshape(-1, w.shape[-1]))
        return q.reshape(w.shape), s.reshape(w.shape[0], -1)
    pairs = [quantize_blocks(e, block) for e in w]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


def dequantize_experts(
    q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None
) -> torch.Tensor:
    """The float32 values of quantize_experts' (q, scale)."""
    if block is None:
        return q.float() * scale[:, :, None]
    return torch.stack([dequantize_blocks(q[e], scale[e], block) for e in range(len(q))])


class Fp8MoEMethod(FusedMoEMethodBase):
    """FP8 experts with per-channel (`block` None) or block-wise scales (see the module).
    `online`: the checkpoint has no scales (they are computed as the weights load)."""

    def __init__(self, block: tuple[int, int] | None, online: bool) -> None:
        self.block = block
        self.online = online

    def create_weights(
        self,
        layer: nn.Module,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
    ) -> None:
        E, H, i = num_experts, hidden_size, intermediate_size_per_partition
        if self.block is None:
            w13_scale = make_param(
                layer, "w13_weight_scale", torch.ones(E, 2 * i, dtype=torch.float32)
            )
            w2_scale = make_param(layer, "w2_weight_scale", torch.ones(E, H, dtype=torch.float32))
            w13_scale.loaded_with_weight = w2_scale.loaded_with_weight = self.online
            quantize = quantize_rows
        else:
            bn, bk = self.block
            if i % bn or (layer.moe_tp_size > 1 and i % bk):
                raise ValueError(
                    f"FP8 weight_block_size {list(self.block)}: the experts' intermediate "
                    f"size per rank ({i}) must be whole blocks; use a smaller --tp-size or "
                    "--ep-size"
                )
            w13_scale = make_param(
                layer,
                "w13_weight_scale_inv",
                torch.ones(E, 2 * i // bn, -(-H // bk), dtype=torch.float32),
                block_size=self.block,
            )
            w2_scale = make_param(
                layer,
                "w2_weight_scale_inv",
                torch.ones(E, -(-H // bn), -(-i // bk), dtype=torch.float32),
                block_size=self.block,
            )
            quantize = functools.partial(quantize_blocks, block=self.block)
        make_param(
            layer,
            "w13_weight",
            torch.empty(E, 2 * i, H, dtype=FP8_DTYPE),
            quantize_into=w13_scale,
            quantize=quantize,
        )
        make_param(
            layer,
            "w2_weight",
            torch.empty(E, H, i, dtype=FP8_DTYPE),
            quantize_into=w2_scale,
            quantize=quantize,
        )

    def _scales(self, layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        if self.block is None:
            return layer.w13_weight_scale, layer.w2_weight_scale
        return layer.w13_weight_scale_inv, layer.w2_weight_scale_inv

    def apply(
        self,
        layer: nn.Module,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        dropped_pairs: bool,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if x.is_cuda and triton is not None:
            w13_scale, w2_scale = self._scales(layer)
            w13, w2, quantize = layer.w13_weight, layer.w2_weight, quantize_activations
            if not triton_fp8_supported(x):  # pre-sm89: the FP8 values, exactly, in x's dtype
                w13, w2 = w13.to(x.dtype), w2.to(x.dtype)
                quantize = functools.partial(quantize_activations_in, dtype=x.dtype)
            fp8 = Fp8Experts(w13_scale, w2_scale, self.block, quantize)
            return fused_experts_triton(
                x,
                w13,
                w2,
                topk_weights,
                topk_ids,
                dropped_pairs=dropped_pairs,
                fp8=fp8,
                residual=residual,
            )
        w13, w2 = self.dequantized_weights(layer)
        group = self.block[1] if self.block is not None else None
        qdq = functools.partial(qdq_activations, group=group)
        out = fused_experts_torch(x.float(), w13, w2, topk_weights, topk_ids, act_qdq=qdq)
        return out.to(x.dtype) if residual is None else residual.add_(out.to(x.dtype))

    def dequantized_weights(self, layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        w13_scale, w2_scale = self._scales(layer)
        return tuple(
            dequantize_experts(w.data, s.data, self.block)
            for w, s in ((layer.w13_weight, w13_scale), (layer.w2_weight, w2_scale))
        )

"""Precision and speed of the grouped FP8 MoE kernel by how its sm90 FP8 dots accumulate.

    python benchmarks/fp8_moe_accumulation.py [--batch-sizes 512 4096] [--promote-k 128 32]

For Qwen3-30B-A3B's experts (E 128, top-8, H 2048, I 768) quantized per channel and in
128 x 128 blocks, each batch size M runs fused_experts_triton with the layer's tiles
(the shipped file for this card, else the heuristic) at each fused_moe_triton.FP8_PROMOTE_K
(None: Triton's default, reduced-precision accumulation over the whole dot on sm90; K:
an fp32 add every K elements) and prints the relative error against the dequantized
reference with the same activation quantization (float32 activations, so only the
accumulation differs) and the microseconds per call (bf16 activations, CUDA-graph replay).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mini_sglang.layers.moe import fused_moe_triton  # noqa: E402
from mini_sglang.layers.moe.experts_torch import fused_experts_torch  # noqa: E402
from mini_sglang.layers.moe.fused_moe_triton import Fp8Experts, fused_experts_triton  # noqa: E402
from mini_sglang.layers.moe.router import select_experts  # noqa: E402
from mini_sglang.layers.quantization.fp8_moe import (  # noqa: E402
    dequantize_experts,
    qdq_activations,
    quantize_activations,
    quantize_experts,
)
from mini_sglang.utils.cuda_timing import cuda_time_ms  # noqa: E402


def run_case(m: int, block: tuple[int, int] | None, promotes: list, gen) -> None:
    """Print one line per FP8_PROMOTE_K value for M tokens with `block` scales (None: per
    channel)."""
    E, k, H, inter = 128, 8, 2048, 768
    x = torch.randn(m, H, device="cuda", generator=gen)
    logits = torch.randn(m, E, device="cuda", generator=gen)
    experts = []
    for shape in ((E, 2 * inter, H), (E, H, inter)):
        w = torch.randn(shape, device="cuda", generator=gen) * shape[2] ** -0.5
        q, s = quantize_experts(w, block)
        experts.append((q, s, dequantize_experts(q, s, block)))
    (w13q, w13s, w13d), (w2q, w2s, w2d) = experts
    weights, ids = select_experts(logits, k, True)
    group = block[1] if block is not None else None
    fp8 = Fp8Experts(w13s, w2s, block, quantize_activations)
    ref = fused_experts_torch(
        x, w13d, w2d, weights, ids, act_qdq=lambda t: qdq_activations(t, group)
    )
    xb = x.bfloat16()
    kind = "block" if block else "channel"
    for promote in promotes:
        fused_moe_triton.FP8_PROMOTE_K = promote
        out = fused_experts_triton(x, w13q, w2q, weights, ids, fp8=fp8)
        rel = ((out - ref).norm() / ref.norm()).item()
        us = 1e3 * cuda_time_ms(
            lambda: fused_experts_triton(xb, w13q, w2q, weights, ids, fp8=fp8), 20, graph=True
        )
        print(f"M={m:5d} {kind:>7} promote_k={promote}: rel error {rel:.2e}, {us:.1f} us")
    fused_moe_triton.FP8_PROMOTE_K = None


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[512, 4096])
    p.add_argument("--promote-k", type=int, nargs="*", default=[128, 32])
    args = p.parse_args(argv)
    if not torch.cuda.is_available():  # after parsing, so --help works anywhere
        raise SystemExit("fp8_moe_accumulation.py needs a CUDA device")
    gen = torch.Generator(device="cuda").manual_seed(0)
    print(torch.cuda.get_device_name())
    for m in args.batch_sizes:
        for block in (None, (128, 128)):
            run_case(m, block, [None, *args.promote_k], gen)


if __name__ == "__main__":
    main()

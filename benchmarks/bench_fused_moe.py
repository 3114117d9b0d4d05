"""Speed of the fused MoE layer (router + alignment + grouped GEMMs) per batch size.

    python benchmarks/bench_fused_moe.py [--experts 128 --top-k 8 --hidden 2048 --inter 768]
        [--tp 1] [--dtype bf16|fp8|fp8-block] [--batch-sizes 1 2 4 ...]
        [--result-filename out.jsonl]

Defaults are Qwen3-30B-A3B's expert shapes (one layer, tp 1). Each batch size is timed as a
CUDA-graph replay (kernels' GPU time, as in a decode step); the weights (1.2 GB in bf16) do
not fit in L2, so every replay reads them from HBM. Reported per batch size M:

- us: microseconds per layer call;
- GB/s: bytes that must move (the weights of every expert the batch touches, plus the
  activations) over the time, and its share of the card's peak bandwidth;
- TFLOP/s: 2 * M * top_k * 3 * I * H (the two GEMMs) over the time, and its share of the
  card's dense bf16 peak.

Small batches are bandwidth bound (compare GB/s with the peak), large ones compute bound
(compare TFLOP/s). `--dtype fp8` serves FP8 experts with per-channel scales (what
`--quantization fp8` gives a bf16 checkpoint), `fp8-block` with 128 x 128 block scales
(Qwen3-30B-A3B-FP8): one byte per weight, w8a8 GEMMs, so compare GB/s and TFLOP/s with the
card's FP8 peak (the weights' bytes are half of bf16's; an FP8 decode step should take
about half the time). The tile sizes are what the layer would pick (kernel_config.get_config:
a tuned file for this card if one ships, else the default heuristic).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mini_sglang.layers.moe import kernel_config  # noqa: E402
from mini_sglang.layers.moe.layer import FusedMoE  # noqa: E402
from mini_sglang.layers.quantization.fp8 import Fp8Config  # noqa: E402
from mini_sglang.layers.quantization.methods import QuantSpec  # noqa: E402
from mini_sglang.utils.cuda_timing import cuda_time_ms  # noqa: E402

# (HBM bytes/s, dense bf16 FLOP/s, dense fp8 FLOP/s) by a substring of the device name
PEAKS = {
    "H200": (4.8e12, 989e12, 1979e12),
    "H100": (3.35e12, 989e12, 1979e12),
    "A100": (2.0e12, 312e12, None),
}
# --dtype: the QuantSpec of the experts (None: bf16)
DTYPES = {
    "bf16": None,
    "fp8": QuantSpec("fp8"),
    "fp8-block": QuantSpec("fp8", checkpoint_fp8=True, weight_block_size=(128, 128)),
}
BATCH_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]


def card_peaks(fp8: bool) -> tuple[float, float] | None:
    """(bytes/s, FLOP/s) of this card for the GEMMs' dtype, or None if unknown."""
    name = torch.cuda.get_device_name()
    peaks = next((p for key, p in PEAKS.items() if key in name), None)
    if peaks is None or (fp8 and peaks[2] is None):
        return None
    return peaks[0], peaks[2] if fp8 else peaks[1]


def bytes_moved(m: int, ids: torch.Tensor, layer: FusedMoE, hidden: int) -> int:
    """Weights of the experts the batch routes to (their element size: 2 bf16, 1 FP8; the
    scales are negligible), plus x, the [M*k, I] activation and the [M*k, H] per-slot
    outputs (each written once and read once) and the output (bf16)."""
    touched = int(torch.unique(ids).numel())
    i = layer.intermediate_per_partition
    weights = touched * 3 * i * hidden * layer.w13_weight.element_size()
    pairs = ids.numel()
    acts = 2 * m * hidden * 2 + pairs * (i + hidden) * 2 * 2
    return weights + acts


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--inter", type=int, default=768, help="per-expert intermediate size")
    p.add_argument("--tp", type=int, default=1, help="shard the intermediate size as TP would")
    p.add_argument("--dtype", choices=list(DTYPES), default="bf16", help="the experts' weights")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=BATCH_SIZES)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--result-filename", default=None)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    spec = DTYPES[args.dtype]
    quant_config = None if spec is None else Fp8Config(spec)
    with torch.device("cuda"):
        layer = FusedMoE(
            args.experts, args.top_k, args.hidden, args.inter // args.tp, True,
            quant_config=quant_config,
        )  # fmt: skip
        w13 = torch.empty(layer.w13_weight.shape).normal_(0, args.hidden**-0.5)
        w2 = torch.empty(layer.w2_weight.shape).normal_(0, args.inter**-0.5)
    torch.set_default_dtype(torch.float32)
    layer.load_full(layer.w13_weight, w13)  # quantized while loading for FP8
    layer.load_full(layer.w2_weight, w2)
    del w13, w2
    peaks = card_peaks(spec is not None)
    name = torch.cuda.get_device_name()
    print(
        f"{name}: E={args.experts} top-{args.top_k} H={args.hidden} "
        f"I={args.inter // args.tp} {args.dtype}"
    )
    rows = []
    for m in args.batch_sizes:
        x = torch.randn(m, args.hidden, dtype=torch.bfloat16, device="cuda")
        logits = torch.randn(m, args.experts, device="cuda")
        ms = cuda_time_ms(lambda x=x, logits=logits: layer(x, logits), args.iters, graph=True)
        _, ids = torch.topk(logits, args.top_k, dim=-1)
        gbs = bytes_moved(m, ids, layer, args.hidden) / (ms / 1e3) / 1e9
        tflops = 2 * m * args.top_k * 3 * layer.intermediate_per_partition * args.hidden
        tflops = tflops / (ms / 1e3) / 1e12
        gemm_dtype = torch.bfloat16 if spec is None else torch.float8_e4m3fn
        block = None if spec is None else spec.weight_block_size
        cfg = kernel_config.get_config(
            m, args.experts, layer.intermediate_per_partition, args.top_k, gemm_dtype,
            x.device, block,
        )  # fmt: skip
        row = dict(
            device=name, m=m, us=round(ms * 1e3, 2), gb_s=round(gbs, 1),
            tflop_s=round(tflops, 2), config=cfg, experts=args.experts, top_k=args.top_k,
            hidden=args.hidden, inter=layer.intermediate_per_partition, dtype=args.dtype,
        )  # fmt: skip
        share = ""
        if peaks is not None:
            row["bw_share"] = round(gbs * 1e9 / peaks[0], 3)
            row["flop_share"] = round(tflops * 1e12 / peaks[1], 3)
            share = f" ({100 * row['bw_share']:.0f}% of peak BW, {100 * row['flop_share']:.1f}% of peak FLOP/s)"
        print(f"M={m:5d}: {row['us']:9.1f} us  {gbs:7.0f} GB/s  {tflops:7.2f} TFLOP/s{share}")
        rows.append(row)
    if args.result_filename:
        with open(args.result_filename, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return rows


if __name__ == "__main__":
    if not torch.cuda.is_available():
        raise SystemExit("bench_fused_moe.py needs a CUDA device")
    main()

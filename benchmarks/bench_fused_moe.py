"""Speed of the fused MoE layer (router + alignment + grouped GEMMs) per batch size.

    python benchmarks/bench_fused_moe.py [--experts 128 --top-k 8 --hidden 2048 --inter 768]
        [--tp 1] [--dtype bf16|fp8|fp8-block] [--batch-sizes 1 2 4 ...]
        [--small-m 0 8] [--small-m-sweep] [--result-filename out.jsonl]

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

`--small-m T [T ...]` times the layer once per threshold T of the small-batch GEMV path
(layers/moe/fused_moe_gemv.py; what MINI_SGLANG_MOE_SMALL_M=T sets): T 0 is the grouped
path; above T an arm runs the grouped path too, so with T 0 among the arms it is timed
only at batch sizes up to T. Rows carry `small_m` and `path` ("grouped" or "gemv"). `--small-m-sweep`
also times the GEMV path's kernels with other tiles (SWEEP: kernel 1's, then kernel 2's
with kernel 1's best) at every batch size up to the largest T and reports the fastest
(rows with `path` "gemv-sweep"): what TUNED in fused_moe_gemv.py should become.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mini_sglang.layers.moe import fused_moe_gemv, kernel_config  # noqa: E402
from mini_sglang.layers.moe.fused_moe_gemv import GemvTiles, SmallMConfig  # noqa: E402
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
# --small-m-sweep: candidates for each GEMV kernel,
# (BLOCK_N, BLOCK_K, num_warps[, num_stages]). The last rows: whole-K tiles of kernel 1
# (its hidden 2048 in one step, as the dense GEMV's best M=1 configs read a whole row),
# deeper K-loop pipelining of the short tiles, 16-warp tiles of kernel 2 (at
# (8, 128, 8) it needs 66 registers a thread: 3 programs, 24 warps per SM; at (16, 256,
# 16) 88, one program per SM, and its 128 programs at one token are one wave on 132 SMs
# where the shipped (8, 256, 8, 3) makes 256 programs of one per SM, two waves;
# benchmarks/kernel_resources.py), and one-warp tiles of kernel 1.
SWEEP = [
    (2, 1024, 4), (4, 512, 4), (4, 1024, 8), (8, 256, 4), (8, 512, 8), (16, 128, 4),
    (2, 512, 8), (4, 256, 8), (8, 128, 8), (2, 256, 4),
    (1, 2048, 4), (2, 2048, 8), (4, 2048, 8), (16, 256, 8),
    (8, 128, 8, 3), (8, 256, 8, 3), (4, 512, 8, 3),
    (8, 128, 16), (4, 256, 16), (16, 128, 16), (16, 256, 16), (8, 512, 16),
    (1, 2048, 1), (2, 1024, 1), (4, 512, 1), (2, 2048, 1),
]  # fmt: skip


def quant_name(args) -> str | None:
    """--dtype as fused_moe_gemv.default_config names the experts' format."""
    return None if args.dtype == "bf16" else args.dtype


def card_peaks(fp8: bool) -> tuple[float, float] | None:
    """(bytes/s, FLOP/s) of this card for the GEMMs' dtype, or None if unknown."""
    name = torch.cuda.get_device_name()
    peaks = next((p for key, p in PEAKS.items() if key in name), None)
    if peaks is None or (fp8 and peaks[2] is None):
        return None
    return peaks[0], peaks[2] if fp8 else peaks[1]


def bytes_moved(m: int, ids: torch.Tensor, layer: FusedMoE, hidden: int, gemv: bool) -> int:
    """Weights of the experts the batch routes to (their element size: 2 bf16, 1 FP8; the
    scales are negligible), plus x, the [M*k, I] activation and (grouped path only) the
    [M*k, H] per-slot outputs (each written once and read once) and the output (bf16)."""
    touched = int(torch.unique(ids).numel())
    i = layer.intermediate_per_partition
    weights = touched * 3 * i * hidden * layer.w13_weight.element_size()
    pairs = ids.numel()
    acts = 2 * m * hidden * 2 + pairs * (i + (0 if gemv else hidden)) * 2 * 2
    return weights + acts


def gemv_shape(layer: FusedMoE, hidden: int) -> tuple[int, int, int, int]:
    """The layer's shape as fused_moe_gemv.default_config takes it (its per-card tiles are
    keyed by it): (local experts, hidden, intermediate per partition, top-k)."""
    return (layer.num_local_experts, hidden, layer.intermediate_per_partition, layer.top_k)


def sweep_gemv(
    layer: FusedMoE, x: torch.Tensor, logits: torch.Tensor, iters: int, quant: str | None
) -> tuple:
    """(fastest SmallMConfig, its ms) for the layer on the GEMV path at this batch: kernel 1's
    SWEEP candidates with kernel 2's default tiles, then kernel 2's with kernel 1's best
    (fused_moe_gemv.default_config is swapped for each timing and restored). It starts
    from the tiles the layer launches by default at this batch."""
    default = fused_moe_gemv.default_config

    def time_config(config: SmallMConfig) -> float:
        fused_moe_gemv.default_config = lambda *args, **kwargs: config
        try:
            return cuda_time_ms(lambda: layer(x, logits), iters, graph=True)
        except Exception:  # tiles the compiler rejects on this card
            return float("inf")
        finally:
            fused_moe_gemv.default_config = default

    start = default(x.shape[0], quant, gemv_shape(layer, x.shape[1]), x.device, x.dtype)
    best = (start, time_config(start))
    for which in ("gate_up", "down"):
        for cand in SWEEP:
            tiles = {"gate_up": best[0].gate_up, "down": best[0].down, which: GemvTiles(*cand)}
            config = SmallMConfig(**tiles)
            ms = time_config(config)
            if ms < best[1]:
                best = (config, ms)
    return best


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
    p.add_argument(
        "--small-m", type=int, nargs="+", default=[fused_moe_gemv.MAX_TOKENS],
        help="GEMV-path thresholds to time (0: grouped path; default MINI_SGLANG_MOE_SMALL_M)",
    )  # fmt: skip
    p.add_argument("--small-m-sweep", action="store_true", help="also sweep the GEMV tiles")
    p.add_argument("--result-filename", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():  # after parsing, so --help works anywhere
        raise SystemExit("bench_fused_moe.py needs a CUDA device")
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
        _, ids = torch.topk(logits, args.top_k, dim=-1)
        for small_m in args.small_m:
            if 0 < small_m < m and 0 in args.small_m:  # the grouped path: timed at T 0
                continue
            fused_moe_gemv.MAX_TOKENS = small_m
            path = "gemv" if fused_moe_gemv.use_small_m(m) else "grouped"
            ms = cuda_time_ms(lambda x=x, logits=logits: layer(x, logits), args.iters, graph=True)
            rows.append(report(args, layer, spec, peaks, m, ids, ms, small_m, path))
        if args.small_m_sweep and m <= max(args.small_m):
            fused_moe_gemv.MAX_TOKENS = m
            config, ms = sweep_gemv(layer, x, logits, args.iters, quant_name(args))
            rows.append(report(args, layer, spec, peaks, m, ids, ms, m, "gemv-sweep", config))
            print(f"{'':>13} best tiles {rows[-1]['config']}")
    if args.result_filename:
        with open(args.result_filename, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return rows


def report(
    args, layer, spec, peaks, m, ids, ms, small_m: int, path: str, tiles: SmallMConfig | None = None
) -> dict:
    """The result row of one timing (see the module), printed as one line; `path` "grouped",
    "gemv" (fused_moe_gemv.default_config's tiles) or "gemv-sweep" (`tiles`)."""
    name = torch.cuda.get_device_name()
    gemv = path != "grouped"
    gbs = bytes_moved(m, ids, layer, args.hidden, gemv) / (ms / 1e3) / 1e9
    tflops = 2 * m * args.top_k * 3 * layer.intermediate_per_partition * args.hidden
    tflops = tflops / (ms / 1e3) / 1e12
    if gemv:
        shape = gemv_shape(layer, args.hidden)
        # the activations main() times with
        bf16 = torch.bfloat16
        tiles = tiles or fused_moe_gemv.default_config(m, quant_name(args), shape, ids.device, bf16)
        cfg = dataclasses.asdict(tiles)
    else:
        gemm_dtype = torch.bfloat16 if spec is None else torch.float8_e4m3fn
        block = None if spec is None else spec.weight_block_size
        cfg = kernel_config.get_config(
            m, args.experts, layer.intermediate_per_partition, args.top_k, gemm_dtype,
            ids.device, block,
        )  # fmt: skip
    row = dict(
        device=name, m=m, us=round(ms * 1e3, 2), gb_s=round(gbs, 1),
        tflop_s=round(tflops, 2), config=cfg, experts=args.experts, top_k=args.top_k,
        hidden=args.hidden, inter=layer.intermediate_per_partition, dtype=args.dtype,
        small_m=small_m, path=path,
    )  # fmt: skip
    share = ""
    if peaks is not None:
        row["bw_share"] = round(gbs * 1e9 / peaks[0], 3)
        row["flop_share"] = round(tflops * 1e12 / peaks[1], 3)
        share = f" ({100 * row['bw_share']:.0f}% of peak BW, {100 * row['flop_share']:.1f}% of peak FLOP/s)"
    print(
        f"M={m:5d} {path:>10}: {row['us']:9.1f} us  {gbs:7.0f} GB/s  {tflops:7.2f} TFLOP/s{share}"
    )
    return row


if __name__ == "__main__":
    main()

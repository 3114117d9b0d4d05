"""Every batch-1 decode GEMV of a model over a wide grid of Triton GEMV configs, each timed as
the model runs it (qkv with the RMSNorm, gate_up with SiLU-mul, down with the residual add),
weight cold in L2 as in small_m_gemm's own pick.

    python benchmarks/sweep_gemv_configs.py --model llama-3.1-8b [--fp8] [--only down,o]
        [--candidates-only] [--configs 2,0,8,1,3,2 ...] [--out r.jsonl] [--forced f.txt]
        [--shapes down:8192x7168 ...] [--row-pad 64]

The grid is small_m_gemm's candidates (for FP8 weights, its tensor-core dot configs too)
plus BLOCK_N 1-8 (1-16 for FP8 weights, whose rows hold half the bytes), BLOCK_K 2048 up to
the whole row, 4-16 warps and 1-3 stages; --candidates-only times small_m_gemm's candidates
alone (a few minutes less of compiling); --configs adds configs of one's own to either, e.g.
a persistent one (2,0,8,1,3,2). --shapes times shapes of one's own as the named projection's
variant (e.g. down's bytes in other shapes), and --row-pad P stores every weight with rows P
elements longer than K (the GEMV reads a [:, :K] view), both to tell a shape's or a row
stride's cost from the bytes'. Prints cuBLAS, the pick and the best 8 configs per shape, and
writes MINI_SGLANG_GEMV_CONFIGS values for a model A/B: --forced gets the shapes whose best config
beats the pick by >= 2%, FILE.all the best config of every shape. On an H100 this grid
found nothing the picks miss (docs/performance/decode-gemv.md).

--fp8: the weights of `--quantization fp8` (float8_e4m3fn, one scale per output row, the
"fp8" variant; the LM head stays bf16 there, so it is left out). The pick's "cuBLAS" is
then the layer's own path (x quantized per token, torch._scaled_mm), and the TB/s count one
byte per weight: the bandwidth share that sets batch-1 FP8 decode speed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_linear import projections  # noqa: E402
from mini_sglang.layers import small_m_gemm  # noqa: E402
from mini_sglang.layers.quantization import fp8 as _fp8  # noqa: E402, F401  (its GEMM for the pick)
from mini_sglang.utils.cuda_timing import cuda_time_ms  # noqa: E402

# the fused variant each projection runs as at batch 1 (llama.norms_in_gemvs); gate_up's pick
# is timed as the plain GEMV, and the model then runs that config with SiLU-mul
VARIANTS = {"qkv": ("norm",), "gate_up": ("silu_mul",), "down": ("residual",)}


def grid(name: str, k: int, variant: tuple[str, ...], elem_bytes: int = 2) -> list[tuple]:
    """small_m_gemm's configs plus wider ones, (BLOCK_N, BLOCK_K, warps, stages); a weight
    tile holds at most 64 KiB (elem_bytes per element)."""
    k_pow2 = 1 << (k - 1).bit_length()
    configs = small_m_gemm.candidates(variant)
    for bn in (1, 2, 4, 8) if elem_bytes > 1 else (1, 2, 4, 8, 16):
        if "silu_mul" in variant and bn < 2:  # a program needs a gate row and an up row
            continue
        for bk in (2048, 4096, 8192, 16384):
            if bk > k_pow2 or bn * bk * elem_bytes > 65536 or (name == "lm_head" and bk != 4096):
                continue
            warps = (4, 8) if bk == 2048 else (4, 8, 16) if bk == 4096 else (8, 16)
            stages = (2, 3) if bk == 2048 else (1, 2) if bk < k else (1,)
            for cfg in ((bn, bk, w, st) for w in warps for st in stages):
                if cfg not in configs:
                    configs.append(cfg)
    return configs


def sweep(
    name: str,
    n: int,
    k: int,
    fp8: bool = False,
    candidates_only: bool = False,
    extra: tuple[tuple, ...] = (),
    row_pad: int = 0,
) -> dict:
    variant = VARIANTS.get(name, ()) + (("fp8",) if fp8 else ())
    w = torch.randn(n, k + row_pad, dtype=torch.bfloat16, device="cuda") * 0.02
    if fp8:
        w = w.to(torch.float8_e4m3fn)
    w = w[:, :k]
    x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
    kwargs = small_m_gemm._variant_kwargs(x, w, variant)
    # a bf16 gate_up's pick is timed without its SiLU-mul epilogue, an FP8 one's with it,
    # as the model picks them (small_m_gemm.linear_silu_mul)
    pick_variant = variant if fp8 else tuple(v for v in variant if v != "silu_mul")
    pick_times = small_m_gemm.time_candidates(x, w, pick_variant)
    pick = small_m_gemm.choose(pick_times, **small_m_gemm.pick_rule(x))
    cublas = 1000 * pick_times[None] if pick_times[None] != float("inf") else None
    if candidates_only and pick_variant == variant:
        # the pick timed exactly these configs as this variant: nothing to time again
        times = {cfg: 1000 * t for cfg, t in pick_times.items() if cfg is not None}
        configs = []
    else:
        times = {}
        configs = (
            small_m_gemm.candidates(variant)
            if candidates_only
            else grid(name, k, variant, w.element_size())
        )
    configs += [c for c in extra if c not in configs and c not in times]
    for cfg in configs:
        try:
            times[cfg] = 1000 * cuda_time_ms(
                lambda cfg=cfg: small_m_gemm.gemv(x, w, cfg, **kwargs), cold_l2=True
            )
        except Exception:  # a config the compiler rejects on this card
            continue
    ranked = sorted(times.items(), key=lambda kv: kv[1])
    return {"gemm": name, "n": n, "k": k, "variant": list(variant), "cublas_us": cublas,
            "pick": pick, "pick_us": times.get(pick) if pick else cublas, "row_pad": row_pad,
            "weight_bytes": n * k * w.element_size(),
            "card": torch.cuda.get_device_name(),
            "times": [[list(c), t] for c, t in ranked]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--fp8", action="store_true", help="FP8 weights with per-row scales")
    ap.add_argument("--out", default=None, help="append one JSON row per shape")
    ap.add_argument("--forced", default=None, help="write MINI_SGLANG_GEMV_CONFIGS values here")
    ap.add_argument("--only", default=None, help="comma-separated projections, e.g. down,o")
    ap.add_argument("--candidates-only", action="store_true", help="no configs beyond the pick's")
    ap.add_argument(
        "--configs", nargs="*", default=[],
        help="more configs to time, e.g. 2,0,8,1,3,2 (a persistent one) or 4,2048,4,2",
    )  # fmt: skip
    ap.add_argument(
        "--shapes", nargs="*", default=[],
        help="more shapes, NAME:NxK, timed as projection NAME's variant, e.g. down:8192x7168",
    )  # fmt: skip
    ap.add_argument("--row-pad", type=int, default=0, help="weight rows this much longer than K")
    args = ap.parse_args()
    torch.manual_seed(0)
    forced, best_all = [], []
    extra = tuple(tuple(map(int, c.split(","))) for c in args.configs)
    shapes = [
        (name, (n, k))
        for name, (n, k) in projections(args.model).items()
        if not (args.fp8 and name == "lm_head")
        and not (args.only and name not in args.only.split(","))
    ]
    for spec in args.shapes:
        name, shape = spec.split(":")
        shapes.append((name, tuple(int(v) for v in shape.split("x"))))
    for name, (n, k) in shapes:
        t0 = time.time()
        row = sweep(name, n, k, args.fp8, args.candidates_only, extra, args.row_pad)
        cublas = "n/a" if row["cublas_us"] is None else f"{row['cublas_us']:.1f} us"
        pick_us = row["pick_us"] if row["pick_us"] is not None else float("nan")
        print(f"{name} N={n} K={k} {tuple(row['variant'])}: cuBLAS {cublas}, "
              f"pick {row['pick']} {pick_us:.1f} us; {len(row['times'])} configs in "
              f"{time.time() - t0:.0f} s")  # fmt: skip
        for cfg, t in row["times"][:8]:
            print(f"   {tuple(cfg)} {t:.1f} us  {row['weight_bytes'] / t / 1e6:.2f} TB/s")
        best, best_us = row["times"][0]
        entry = f"{n}x{k}:" + ",".join(map(str, best))
        best_all.append(entry)
        if row["pick_us"] is None or best_us < 0.98 * row["pick_us"]:
            forced.append(entry)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    print("forced:", ";".join(forced))
    if args.forced:
        with open(args.forced, "w") as f:
            f.write(";".join(forced))
        with open(args.forced + ".all", "w") as f:
            f.write(";".join(best_all))


if __name__ == "__main__":
    main()

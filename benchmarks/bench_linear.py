"""The decode GEMMs alone (torch.nn.functional.linear, i.e. cuBLAS): time, weight TB/s, TFLOPS.

    python benchmarks/bench_linear.py --model llama-3.1-8b --m 1 64 256 [--out r.jsonl]

Batch-1 decode is a chain of weight-streaming GEMVs, so its floor is weight bytes over memory
bandwidth. This times each projection of one layer (fused QKV, O, fused gate-up, down) and
the LM head at M rows, rotating through enough copies of each weight that none is served
from L2 (50 MB on an H100), and adds them up as layers x per-layer + LM head: the GEMM part
of a decode step, to set against bench_one_batch's ms/token.

`--fp8-block` also times the attention projections with block-wise FP8 weights (128 x 128
scales, Qwen3-FP8's format) at each M: fp8_kernels.block_fp8_linear (x quantized per group,
the block matmul) against fused_moe_gemv.block_fp8_gemv at each FP8_BLOCK_TILES entry and,
at one row, small_m_gemm's persistent GEMV at each of its block-scaled candidates. `--fp8`
times the attention projections and a dense MLP's with per-channel FP8 weights:
small_m_gemm's "fp8" candidates against fused_moe_gemv.channel_fp8_gemv at the same tiles.
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from mini_sglang.utils.cuda_timing import cuda_time_ms

MODELS_DIR = Path(__file__).parent / "models"


def config(model: str) -> dict:
    return json.loads((MODELS_DIR / model / "config.json").read_text())


def projections(model: str) -> dict[str, tuple[int, int]]:
    """(out_features, in_features) of each decode GEMM, from benchmarks/models/MODEL."""
    c = config(model)
    h, qh, kvh = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    d = c.get("head_dim") or h // qh
    inter, vocab = c["intermediate_size"], c["vocab_size"]
    return {
        "qkv": ((qh + 2 * kvh) * d, h),
        "o": (h, qh * d),
        "gate_up": (2 * inter, h),
        "down": (h, inter),
        "lm_head": (vocab, h),
    }


def time_linear(m: int, n: int, k: int, iters: int = 30, op=F.linear) -> float:
    """Microseconds per op([m, k], [n, k]) (default F.linear, i.e. x @ w^T) in bf16, weights
    cold in L2."""
    weight_bytes = n * k * 2
    copies = max(2, -(-(256 << 20) // weight_bytes))
    ws = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02 for _ in range(copies)]
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    turn = itertools.count()
    # graph replay: the kernels' GPU time, as in a CUDA-graph decode step (see cuda_time_ms)
    return 1000 * cuda_time_ms(lambda: op(x, ws[next(turn) % copies]), iters, copies, graph=True)


# --sweep: a wider grid than small_m_gemm's own list (BLOCK_N, BLOCK_K, warps, stages), to
# find out whether any Triton GEMV config beats cuBLAS before widening that list
SWEEP = [
    (bn, bk, w, st)
    for bn in (1, 2, 4, 8)
    for bk in (1024, 2048, 4096)
    for w in (4, 8)
    for st in (1, 2, 3)
    if bn * bk <= 16384
]


def time_triton_gemv(m: int, n: int, k: int, sweep: bool = False) -> tuple[float, tuple] | None:
    """(us, config) of layers/small_m_gemm.py's Triton GEMV at its best config, timed like
    cuBLAS above; None where it does not apply (M above its limit)."""
    from mini_sglang.layers.small_m_gemm import _CONFIGS, MAX_M, gemv

    if m > MAX_M:
        return None
    timed = []
    for cfg in SWEEP if sweep else _CONFIGS:
        try:
            timed.append((time_linear(m, n, k, op=lambda x, w, c=cfg: gemv(x, w, c)), cfg))
        except Exception:  # a config the compiler rejects on this card (small_m_gemm skips it too)
            continue
    return min(timed) if timed else None


# --fp8-block: block_fp8_gemv's candidate tiles (BLOCK_N, BLOCK_K, warps[, stages])
FP8_BLOCK_TILES = [
    (2, 2048, 4), (4, 1024, 4), (4, 512, 4), (8, 512, 4), (8, 1024, 8), (8, 256, 4),
    (16, 256, 4), (16, 512, 8), (16, 128, 4), (32, 256, 8), (4, 2048, 8), (8, 2048, 8),
]  # fmt: skip


def _cold_timer(n: int, k: int, quantize) -> Callable[[Callable], float]:
    """A timer of op(weight, scale) in microseconds, rotating through enough copies of a
    random [n, k] weight, quantized by `quantize` into (weight, scale), that none is read
    from L2 (256 MiB of them, at least two)."""
    copies = max(2, -(-(256 << 20) // (n * k)))
    ws = [quantize(torch.randn(n, k, device="cuda") * 0.02) for _ in range(copies)]

    def timed(op: Callable) -> float:
        turn = itertools.count()
        return 1000 * cuda_time_ms(lambda: op(*ws[next(turn) % copies]), 30, copies, graph=True)

    return timed


def time_fp8_block(m: int, n: int, k: int, block=(128, 128)) -> dict[str, float]:
    """Microseconds per x [m, k] (bf16) @ w^T for a block-wise FP8 w [n, k], weights cold in
    L2: "block_fp8_linear", and block_fp8_gemv at each FP8_BLOCK_TILES entry the compiler
    accepts (keyed by the tiles), and at one row small_m_gemm's block-scaled persistent
    candidates (keyed "persistent" and the config)."""
    from mini_sglang.layers import small_m_gemm
    from mini_sglang.layers.moe.fused_moe_gemv import GemvTiles, block_fp8_gemv
    from mini_sglang.layers.quantization.fp8_kernels import block_fp8_linear, quantize_blocks

    timed = _cold_timer(n, k, lambda w: quantize_blocks(w, block))
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    times = {"block_fp8_linear": timed(lambda w, s: block_fp8_linear(x, w, s, block))}
    for tiles in FP8_BLOCK_TILES:
        op = lambda w, s, t=GemvTiles(*tiles): block_fp8_gemv(x, w, s, block, tiles=t)  # noqa: E731
        try:
            times[str(tiles)] = timed(op)
        except Exception:  # tiles the compiler rejects on this card
            continue
    variant = (f"fp8block{block[0]}x{block[1]}",)
    for cfg in small_m_gemm.candidates(variant, rows=m):  # persistent, one row only
        op = lambda w, s, c=cfg: small_m_gemm.gemv(x, w, c, w_scale=s, w_block=block)  # noqa: E731
        times[f"persistent {cfg}"] = timed(op)
    return times


def time_fp8_channel(m: int, n: int, k: int) -> dict[str, float]:
    """Microseconds per x [m, k] (bf16) @ w^T for a per-channel FP8 w [n, k] (--quantization
    fp8), weights cold in L2: small_m_gemm's candidates for the "fp8" variant (keyed
    "gemv" and the config) and fused_moe_gemv.channel_fp8_gemv at each FP8_BLOCK_TILES
    entry the compiler accepts (keyed by the tiles)."""
    from mini_sglang.layers import small_m_gemm
    from mini_sglang.layers.moe.fused_moe_gemv import GemvTiles, channel_fp8_gemv
    from mini_sglang.layers.quantization.fp8_kernels import quantize_rows

    timed = _cold_timer(n, k, quantize_rows)
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    times = {}
    for cfg in small_m_gemm.candidates(("fp8",), rows=m):
        op = lambda w, s, c=cfg: small_m_gemm.gemv(x, w, c, w_scale=s)  # noqa: E731
        try:
            times[f"gemv {cfg}"] = timed(op)
        except Exception:  # a config the compiler rejects on this card
            continue
    for tiles in FP8_BLOCK_TILES:
        op = lambda w, s, t=GemvTiles(*tiles): channel_fp8_gemv(x, w, s, tiles=t)  # noqa: E731
        try:
            times[str(tiles)] = timed(op)
        except Exception:
            continue
    return times


def small_m_pick(m: int, n: int, k: int) -> str:
    """What small_m_gemm's own per-shape pick (cold-L2 timing, one weight) chooses here, with
    its timings of cuBLAS and of the chosen config."""
    from mini_sglang.layers.small_m_gemm import MAX_M, choose, pick_rule, time_candidates

    if m > MAX_M:
        return ""
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    times = time_candidates(x, w)
    best = choose(times, **pick_rule(x))
    return f"{best or 'cuBLAS'} (cold: cuBLAS {1000 * times[None]:.1f}, best {1000 * min(times.values()):.1f} us)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    models = sorted(p.name for p in MODELS_DIR.iterdir() if (p / "config.json").exists())
    ap.add_argument("--model", choices=models, default="llama-3.1-8b")
    ap.add_argument("--m", type=int, nargs="+", default=[1, 8, 64, 128, 256])
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--triton",
        action="store_true",
        help="also time small_m_gemm's Triton GEMV (M <= 8), to check its per-shape pick",
    )
    ap.add_argument("--sweep", action="store_true", help="with --triton: a wide config grid")
    ap.add_argument(
        "--cublaslt",
        action="store_true",
        help="time F.linear with torch's cuBLASLt backend instead of cuBLAS",
    )
    ap.add_argument(
        "--fp8-block",
        action="store_true",
        help="also time qkv and o with block-wise FP8 weights (block_fp8_gemv's tiles)",
    )
    ap.add_argument(
        "--fp8",
        action="store_true",
        help="also time the attention projections and a dense MLP's with per-channel FP8 weights: "
        "small_m_gemm's candidates against channel_fp8_gemv's tiles",
    )
    args = ap.parse_args()
    if args.cublaslt:
        torch.backends.cuda.preferred_blas_library("cublaslt")
    layers = config(args.model)["num_hidden_layers"]
    card = torch.cuda.get_device_name()
    print(f"{args.model} on {card}")
    print(f"{'M':>5}{'gemm':>9}{'N':>8}{'K':>7}{'us':>9}{'TB/s':>7}{'TFLOPS':>8}")
    for m in args.m:
        step_us = 0.0
        for name, (n, k) in projections(args.model).items():
            us = time_linear(m, n, k)
            tbs = n * k * 2 / us / 1e6
            tflops = 2 * m * n * k / us / 1e6
            step_us += us * (1 if name == "lm_head" else layers)
            tri = time_triton_gemv(m, n, k, args.sweep) if args.triton else None
            extra = f"   triton {tri[0]:.1f} us {tri[1]}" if tri else ""
            if args.triton:
                extra += f"   pick {small_m_pick(m, n, k)}"
            print(f"{m:>5}{name:>9}{n:>8}{k:>7}{us:>9.1f}{tbs:>7.2f}{tflops:>8.1f}{extra}")
            if args.out:
                with open(args.out, "a") as f:
                    rec = {"model": args.model, "m": m, "gemm": name, "n": n, "k": k, "us": us,
                           "weight_tb_s": tbs, "tflops": tflops, "card": card, "blas": "cublaslt" if args.cublaslt else "cublas",
                           "triton_us": tri[0] if tri else None, "triton_cfg": tri[1] if tri else None}  # fmt: skip
                    f.write(json.dumps(rec) + "\n")
        print(
            f"{m:>5} GEMMs of one decode step ({layers} layers + LM head): {step_us / 1000:.3f} ms"
        )
        moe = "num_experts" in config(args.model)  # its MLPs are experts (bench_fused_moe.py)
        for name in (("qkv", "o") if moe else ("qkv", "o", "gate_up", "down")) if args.fp8 else ():
            n, k = projections(args.model)[name]
            times = time_fp8_channel(m, n, k)
            ranked = sorted(times.items(), key=lambda i: i[1])
            gemv = next((t, us) for t, us in ranked if t.startswith("gemv"))
            kern = next(((t, us) for t, us in ranked if not t.startswith("gemv")), ("-", 0.0))
            print(f"{m:>5} fp8 {name} {n}x{k}: best small_m_gemm {gemv[0]} {gemv[1]:.1f} us, "
                  f"best channel_fp8_gemv {kern[0]} {kern[1]:.1f} us")  # fmt: skip
            if args.out:
                with open(args.out, "a") as f:
                    rec = {"model": args.model, "m": m, "gemm": name, "n": n, "k": k,
                           "fp8_channel_us": times, "card": card}  # fmt: skip
                    f.write(json.dumps(rec) + "\n")
        for name in ("qkv", "o") if args.fp8_block else ():
            n, k = projections(args.model)[name]
            times = time_fp8_block(m, n, k)
            best = min((t for t in times if t != "block_fp8_linear"), key=times.get, default=None)
            ranked = ", ".join(
                f"{t} {us:.1f}" for t, us in sorted(times.items(), key=lambda i: i[1])
            )
            print(f"{m:>5} fp8-block {name} {n}x{k}: TB/s at the best {n * k / times[best] / 1e6:.2f}; us: {ranked}")  # fmt: skip
            if args.out:
                with open(args.out, "a") as f:
                    rec = {"model": args.model, "m": m, "gemm": name, "n": n, "k": k,
                           "fp8_block_us": times, "best": best, "card": card}  # fmt: skip
                    f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()

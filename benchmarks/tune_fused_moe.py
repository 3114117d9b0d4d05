"""Tune the fused MoE kernel's tile sizes per batch size and write the config file the layer
looks up (mini_sglang/layers/moe/kernel_config.py).

    python benchmarks/tune_fused_moe.py [--model DIR | --experts 128 --top-k 8 --hidden 2048
        --inter 768] [--tp 1 | --ep 1] [--dtype bf16|fp8|fp8-block] [--batch-sizes 1 2 4 ...]
        [--out-dir mini_sglang/layers/moe/configs]

Defaults: Qwen3-30B-A3B at tp 1 on this card. For each batch size M every candidate of the
search space is timed as a CUDA-graph replay of the whole expert computation (both grouped
GEMMs on its tiles), with routing drawn at random as a router would; the fastest is kept,
then the second GEMM's tiles are searched with the first's fixed (tune_one; the file's
"down" entries). Candidates are checked against the torch reference once (a wrong result
is an error, not a fast config). The file is named for (E local, N = I * ep / tp, top-k,
bf16, this device) and holds {M: config}; commit it under mini_sglang/layers/moe/configs/.
Mixtral-8x7B: --experts 8 --top-k 2 --hidden 4096 --inter 14336, or --model DIR: the shape
from a model directory's config.json (e.g. benchmarks/models/mixtral-8x7b; shape flags
given as well win). `--dtype fp8` tunes FP8 experts with per-channel scales
(`--quantization fp8`), `fp8-block` with 128 x 128 block scales (Qwen3-30B-A3B-FP8; K
tiles of at most 128); their files are named
dtype=float8_e4m3fn (and block_shape=[128,128]), and candidates are checked against the
dequantized reference with the same activation quantization (relative error).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mini_sglang.layers.moe import kernel_config  # noqa: E402
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

BATCH_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]


SMEM_LIMIT = 200 * 1024  # bytes of staged tiles; the first GEMM stages A, gate and up tiles


# --dtype: the block shape of FP8 weight scales (None: per channel), absent for bf16
FP8_BLOCKS = {"fp8": None, "fp8-block": (128, 128)}


def search_space(
    m: int, top_k: int, experts: int, max_bk: int | None = None
) -> list[dict[str, int]]:
    """Candidate configs for batch m. While an expert gets at most 16 pairs on average
    (decode; the weight stream decides): 16-row blocks, and 32-row ones from 8 pairs on,
    where a 16-row block often leaves a second block of the same expert re-reading its
    weights (Poisson(16) pairs exceed 16 for 43% of experts; SGLang's shipped H100 and
    H200 files for this shape pick 32 rows at 256 tokens), with 4 or 8 warps. Beyond: block
    rows up to twice the pairs with grouped order. N and K tiles, warps and stages swept
    where the staged tiles fit in shared memory (about 170 distinct configs over the
    default batch sizes: each compiles once, some minutes in all)."""
    per_expert = m * top_k / experts
    if per_expert <= 16:
        block_ms = (16, 32) if per_expert >= 8 else (16,)
        space = itertools.product(
            block_ms, (1,), (32, 64, 128), (64, 128, 256), (4, 8), (2, 3, 4, 5)
        )
    else:
        block_ms = [bm for bm in (32, 64, 128) if bm <= 2 * per_expert]
        space = itertools.product(block_ms, (16,), (64, 128, 256), (64, 128), (4, 8), (2, 3, 4))
    out = []
    for bm, gm, bn, bk, warps, stages in space:
        if stages * (bm * bk + 2 * bk * bn) * 2 > SMEM_LIMIT or bk > (max_bk or bk):
            continue
        out.append(
            dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=gm,
                 num_warps=warps, num_stages=stages)
        )  # fmt: skip
    return out


def quantize_experts_with_reference(
    w: torch.Tensor, block: tuple[int, int] | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-expert FP8 values, scales and dequantized float32 weights of w [E, N, K]."""
    q, s = quantize_experts(w, block)
    return q, s, dequantize_experts(q, s, block)


def _check(out: torch.Tensor, ref: torch.Tensor, fp8: Fp8Experts | None) -> None:
    """bf16: elementwise within 3e-2; FP8: within 5% relative (Frobenius), as bf16 storage
    of the intermediate activation moves a few percent of it to a neighbouring FP8 value."""
    if fp8 is None:
        torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=3e-2)
        return
    rel = ((out.float() - ref).norm() / ref.norm()).item()
    assert rel < 5e-2, f"relative error {rel:.3g} against the dequantized reference"


def tune_one(
    m: int, args, w13: torch.Tensor, w2: torch.Tensor, fp8: Fp8Experts | None = None,
    ref_weights: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[dict, float, float]:  # fmt: skip
    """The fastest config at batch m, its time and the fastest single config's (both GEMMs
    on one config's tiles). FP8: w13 / w2 hold FP8 values with `fp8`'s scales, and
    ref_weights are their dequantized values.

    Two passes, each timing the whole expert computation: every candidate for both GEMMs;
    then, for each block-row count, the second GEMM's tiles from every candidate of those
    rows with the first GEMM's kept at that count's best (a "down" entry where they win).
    The GEMMs differ in K (hidden against intermediate size) and in the first's two weight
    tiles and SiLU epilogue, so their best N / K tiles and pipelining need not agree."""
    x = torch.randn(m, args.hidden, dtype=torch.bfloat16, device="cuda")
    logits = torch.randn(m, args.experts, device="cuda")
    weights, ids = select_experts(logits, args.top_k, True)
    local = ids - args.first_expert
    dropped = args.ep > 1
    if dropped:
        local = torch.where((local >= 0) & (local < w13.shape[0]), local, -1)
    if fp8 is None:
        ref = fused_experts_torch(x.float(), w13.float(), w2.float(), weights, local)
    else:
        group = fp8.block[1] if fp8.block is not None else None
        ref = fused_experts_torch(
            x.float(), *ref_weights, weights, local, act_qdq=lambda t: qdq_activations(t, group)
        )

    def time_ms(cfg: dict) -> float:
        """cfg's time, inf where it does not launch (out of shared memory or registers)."""
        try:
            _check(fused_experts_triton(x, w13, w2, weights, local, dropped, cfg, fp8), ref, fp8)
            return cuda_time_ms(
                lambda: fused_experts_triton(x, w13, w2, weights, local, dropped, cfg, fp8),
                args.iters,
                graph=True,
            )
        except AssertionError:
            raise
        except Exception as e:  # out of resources (shared memory, registers): not a candidate
            print(f"  M={m} skip {cfg}: {type(e).__name__}", file=sys.stderr)
            return float("inf")

    max_bk = fp8.block[1] if fp8 is not None and fp8.block is not None else None
    space = search_space(m, args.top_k, args.experts, max_bk)
    per_rows: dict[int, tuple[dict, float]] = {}  # block rows -> best single config, time
    for cfg in space:
        ms = time_ms(cfg)
        bm = cfg["BLOCK_SIZE_M"]
        if ms < per_rows.get(bm, (None, float("inf")))[1]:
            per_rows[bm] = (cfg, ms)
    assert per_rows, f"no config ran at M={m}"
    best, single_ms = min(per_rows.values(), key=lambda c: c[1])
    best_ms = single_ms
    for bm, (first, _) in per_rows.items():
        for cfg in space:
            if cfg["BLOCK_SIZE_M"] != bm or cfg == first:
                continue
            split = {**first, "down": {k: cfg[k] for k in kernel_config.DOWN_KEYS}}
            ms = time_ms(split)
            if ms < best_ms:
                best, best_ms = split, ms
    return best, best_ms, single_ms


def model_shape(model_dir: str) -> dict[str, int]:
    """The tuner's shape defaults (experts, top_k, hidden, inter: each expert's intermediate
    size before TP) from a model directory's config.json, Qwen-MoE or Mixtral fields alike."""
    from transformers import AutoConfig

    from mini_sglang.models.sparse_moe import moe_settings

    config = AutoConfig.from_pretrained(model_dir)
    moe = moe_settings(config)
    return dict(
        experts=moe["num_experts"],
        top_k=config.num_experts_per_tok,
        hidden=config.hidden_size,
        inter=moe["intermediate_size"],
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", help="model directory whose config.json gives the shape")
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--inter", type=int, default=768)
    p.add_argument("--tp", type=int, default=1, help="ranks sharding each expert's intermediate")
    p.add_argument("--ep", type=int, default=1, help="expert groups (experts per rank = E / ep)")
    p.add_argument("--dtype", choices=["bf16", *FP8_BLOCKS], default="bf16")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=BATCH_SIZES)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--out-dir", default=kernel_config.CONFIG_DIR)
    model = p.parse_known_args(argv)[0].model
    if model is not None:
        p.set_defaults(**model_shape(model))
    return p.parse_args(argv)


def rank_shape(args: argparse.Namespace) -> tuple[int, int]:
    """(experts a rank holds, each expert's intermediate size on it): the E and N of the
    config file's name. The tp / ep ranks of an expert group split its intermediate size,
    e.g. Mixtral-8x7B (8 experts, 14336) at --tp 2: (8, 7168); at --tp 2 --ep 2: (4, 14336).
    Exits where the split is uneven, as the server's launch check does."""
    per_expert = args.tp // args.ep
    if args.tp % args.ep or args.experts % args.ep or args.inter % per_expert:
        raise SystemExit(
            f"--tp {args.tp} / --ep {args.ep} does not split {args.experts} experts of "
            f"intermediate size {args.inter} evenly"
        )
    return args.experts // args.ep, args.inter // per_expert


def main(argv: list[str] | None = None) -> str:
    args = parse_args(argv)
    if not torch.cuda.is_available():  # after parsing, so --help works anywhere
        raise SystemExit("tune_fused_moe.py needs a CUDA device")
    local_experts, n = rank_shape(args)
    args.first_expert = 0
    torch.manual_seed(0)
    w13 = torch.randn(local_experts, 2 * n, args.hidden, device="cuda") * args.hidden**-0.5
    w2 = torch.randn(local_experts, args.hidden, n, device="cuda") * n**-0.5
    fp8, ref_weights, block = None, None, None
    if args.dtype == "bf16":
        w13, w2 = w13.to(torch.bfloat16), w2.to(torch.bfloat16)
    else:
        block = FP8_BLOCKS[args.dtype]
        w13, w13_scale, w13_ref = quantize_experts_with_reference(w13, block)
        w2, w2_scale, w2_ref = quantize_experts_with_reference(w2, block)
        fp8 = Fp8Experts(w13_scale, w2_scale, block, quantize_activations)
        ref_weights = (w13_ref, w2_ref)
    gemm_dtype = torch.bfloat16 if fp8 is None else torch.float8_e4m3fn
    name = kernel_config.config_file_name(
        local_experts, n, args.top_k, gemm_dtype, torch.cuda.get_device_name(), block
    )
    os.makedirs(args.out_dir, exist_ok=True)
    path = os.path.join(args.out_dir, name)
    print(f"tuning {path}", flush=True)
    table = {}
    for m in args.batch_sizes:
        cfg, ms, single_ms = tune_one(m, args, w13, w2, fp8, ref_weights)
        table[str(m)] = cfg
        print(f"M={m}: {1000 * ms:.1f} us (one config: {1000 * single_ms:.1f}) {cfg}", flush=True)
        # rewritten after every batch size, so a run cut short still leaves what it found
        with open(path, "w") as f:
            json.dump(table, f, indent=2)
            f.write("\n")
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()

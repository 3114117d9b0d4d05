"""Speed of moe_align_block_size alone: the torch version against the Triton one, per batch.

    python benchmarks/bench_moe_align.py [--experts 128 --top-k 8 --inter 768]
        [--tokens 32 64 128 256 512 1024 8192] [--variants auto 256,8 64,4 512,8,64]
        [--result-filename out.jsonl]

Each batch of M tokens routes to top-k distinct random experts per token, with the block
size (BLOCK_SIZE_M) the layer takes at that M for bf16 experts of intermediate size
`--inter` on this card (kernel_config.get_config: the tuned file, else the default). Both
versions are timed as CUDA-graph replays (the GPU time of their kernels, as in a decode
step), and the Triton outputs are checked equal to the torch ones (`equal`).
`--variants CHUNK,WARPS[,SUB] ...` times the Triton version at fixed pairs per program, warps
and rank step (SUB pairs at a time; 0 or left out ranks by comparison) beside `auto`, the
shipped choice per batch (align.launch_shape); compiled resources of the same variants:
`kernel_resources.py --align`.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mini_sglang.layers.moe import align, kernel_config  # noqa: E402
from mini_sglang.utils.cuda_timing import cuda_time_ms  # noqa: E402


def time_us(fn, ids: torch.Tensor, block: int, experts: int, iters: int) -> float:
    """Microseconds per fn(ids, block, experts) as a CUDA-graph replay."""
    return 1e3 * cuda_time_ms(lambda: fn(ids, block, experts), iters, graph=True)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--inter", type=int, default=768, help="per-expert intermediate size")
    p.add_argument("--tokens", type=int, nargs="+", default=[32, 64, 128, 256, 512, 1024, 8192])
    p.add_argument(
        "--variants", nargs="+", default=["auto"], metavar="CHUNK,WARPS[,SUB]",
        help="Triton versions to time (default: auto, the shipped choice per batch)",
    )  # fmt: skip
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--result-filename", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_moe_align.py needs a CUDA GPU")
    e, k = args.experts, args.top_k
    rows = []
    for m in args.tokens:
        ids = torch.stack([torch.randperm(e, device="cuda")[:k] for _ in range(m)]).int()
        config = kernel_config.get_config(m, e, args.inter, k, torch.bfloat16, ids.device)
        block = config["BLOCK_SIZE_M"]
        ref = align.moe_align_block_size_torch(ids, block, e)
        torch_us = time_us(align.moe_align_block_size_torch, ids, block, e, args.iters)
        row = {"tokens": m, "pairs": m * k, "block": block, "experts": e, "torch_us": torch_us}
        for variant in args.variants:
            shape = None
            if variant != "auto":
                chunk, warps, sub = (list(map(int, variant.split(","))) + [0])[:3]
                shape = chunk, sub, warps
            fn = functools.partial(align.moe_align_block_size_triton, shape=shape)
            got = fn(ids, block, e)
            row[f"triton_{variant}_us"] = time_us(fn, ids, block, e, args.iters)
            row[f"triton_{variant}_equal"] = all(torch.equal(a, b) for a, b in zip(ref, got))
        triton_cols = ", ".join(
            f"triton {v} {row[f'triton_{v}_us']:.1f} us"
            + ("" if row[f"triton_{v}_equal"] else " (NOT EQUAL)")
            for v in args.variants
        )
        print(f"M={m:>5} pairs={m * k:>6} block={block}: torch {row['torch_us']:.1f} us, "
              f"{triton_cols}", flush=True)  # fmt: skip
        rows.append(row)
    if args.result_filename:
        with open(args.result_filename, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return rows


if __name__ == "__main__":
    main()

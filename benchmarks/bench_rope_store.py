"""qk_norm_rope_store alone (layers/fused_kernels.py) by tokens and heads per program.

    python benchmarks/bench_rope_store.py [--tokens 1 32 64 128 256 8192] [--heads 1 2 4 8 16] \\
        [--out r.jsonl]

The per-layer kernel that rotates q and k (and RMS-normalises them for Qwen3) and stores K/V
into the pool runs once per layer on every decode step above the batch-1 path and on every
prefill chunk. Each (tokens, heads per program) is timed as CUDA-graph replays (the kernel's
GPU time, as inside a decode graph) for Llama-3.1-8B's heads (32 q, 8 kv, no q/k norm) and
Qwen3-0.6B's (16 q, 8 kv, q/k norm), with the K/V slots scattered over a pool. "GB/s" counts
the bytes the kernel must move: the qkv rows read, q written, k and v stored.
"""

from __future__ import annotations

import argparse
import json

import torch

from mini_sglang.layers.fused_kernels import qk_norm_rope_store
from mini_sglang.utils.cuda_timing import cuda_time_ms

LAYOUTS = {"llama-3.1-8b": (32, 8, 128, False), "qwen3-0.6b": (16, 8, 128, True)}


def time_rope_store(tokens: int, heads: int, num_q: int, num_kv: int, d: int, norm: bool):
    dev, dt = "cuda", torch.bfloat16
    qkv = torch.randn(tokens, (num_q + 2 * num_kv) * d, device=dev, dtype=dt)
    pos = torch.randint(0, 4096, (tokens,), device=dev)
    slots = max(4 * tokens, 1 << 16)
    loc = torch.randperm(slots, device=dev)[:tokens]
    k_buf = torch.empty(slots, num_kv, d, device=dev, dtype=dt)
    v_buf = torch.empty_like(k_buf)
    half = torch.arange(d // 2, device=dev).float()
    freqs = torch.arange(4096, device=dev).float()[:, None] / (1e6 ** (2 * half / d))[None, :]
    cos_sin = torch.cat([freqs.cos(), freqs.sin()], -1)
    w = torch.ones(d, device=dev, dtype=dt) if norm else None

    def run():
        qk_norm_rope_store(
            qkv, pos, cos_sin, num_q, num_kv, d, w, w, 1e-6, loc, k_buf, v_buf,
            heads_per_program=heads,
        )  # fmt: skip

    us = 1000 * cuda_time_ms(run, iters=50, graph=True)
    moved = tokens * d * 2 * ((num_q + 2 * num_kv) + num_q + 2 * num_kv)
    return us, moved / us / 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 32, 64, 128, 256, 8192, 16384])
    p.add_argument("--heads", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--out", default=None)
    args = p.parse_args()
    print(f"{'model':>14} {'tokens':>7} " + " ".join(f"{f'h={h} us':>10}" for h in args.heads))
    for model, (nq, nkv, d, norm) in LAYOUTS.items():
        for t in args.tokens:
            row = []
            for h in args.heads:
                us, gbs = time_rope_store(t, h, nq, nkv, d, norm)
                row.append(us)
                if args.out:
                    rec = dict(model=model, tokens=t, heads_per_program=h, us=us, gb_s=gbs)
                    with open(args.out, "a") as f:
                        f.write(json.dumps(rec) + "\n")
            print(f"{model:>14} {t:>7} " + " ".join(f"{us:10.2f}" for us in row))


if __name__ == "__main__":
    main()

"""The one-kernel gated MLP (layers/fused_mlp.py) against the two GEMVs it replaces, per
config, weights cold in L2 (the timing fused_mlp's pick uses), plus its error against a
float32 reference and whether repeated launches agree bit for bit.

    python benchmarks/bench_fused_mlp.py --model llama-3.1-8b qwen3-0.6b [--m 1 2 4 8] [--out r.jsonl]
        [--configs 2,4096,4,1024,8 ...]

Each row: model, M, config ("unfused" for the two small_m_gemm GEMVs with their own picks),
microseconds per MLP, the weight bytes over that time (TB/s), max |error| against float32
and, for the fused configs, whether three launches gave identical bits.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bench_linear import config  # noqa: E402
from mini_sglang.layers import fused_mlp  # noqa: E402
from mini_sglang.layers.kernels import pdl_enabled  # noqa: E402
from mini_sglang.utils.cuda_timing import cuda_time_ms  # noqa: E402
from tests.unit.test_fused_mlp import mlp_inputs, mlp_reference  # noqa: E402


def rows_for(model: str, m: int, configs: list[tuple]) -> list[dict]:
    c = config(model)
    hidden, inter = c["hidden_size"], c["intermediate_size"]
    x, w_gate_up, w_down, residual = mlp_inputs(m, hidden, inter, torch.bfloat16, "cuda")
    ref = mlp_reference(x, w_gate_up, w_down, residual)
    weight_bytes = (w_gate_up.numel() + w_down.numel()) * 2
    sync = fused_mlp.new_sync_buffer("cuda")
    pdl = pdl_enabled(x)

    def row(name: str, run, identical: bool | None) -> dict:
        out = residual.clone()
        run(out)
        us = 1000 * cuda_time_ms(lambda: run(out.copy_(residual)), cold_l2=True)
        run(out.copy_(residual))
        err = out.float().cpu().sub(ref).abs().max().item()
        return {"model": model, "m": m, "config": name, "us": round(us, 2),
                "tb_s": round(weight_bytes / us / 1e6, 3), "max_err": err, "identical": identical}  # fmt: skip

    rows = [row("unfused", lambda out: fused_mlp._unfused(x, w_gate_up, w_down, out), None)]
    for cfg in configs:

        def run(out, cfg=cfg):
            return fused_mlp.fused_mlp_add_(
                x, w_gate_up, w_down, out, sync, cfg, pdl=pdl, early_ticket=True
            )

        try:
            outs = [run(residual.clone()) for _ in range(3)]
        except Exception as e:  # a config the compiler rejects
            print(f"{model} m={m} {cfg}: {type(e).__name__}: {e}"[:300], flush=True)
            continue
        torch.cuda.synchronize()
        assert not sync.any(), f"sync buffer not reset after {cfg}: {sync[:8].tolist()}"
        identical = all(torch.equal(outs[0], o) for o in outs[1:])
        rows.append(row(",".join(map(str, cfg)), run, identical))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", nargs="+", default=["llama-3.1-8b"])
    ap.add_argument("--m", nargs="+", type=int, default=[1])
    ap.add_argument("--configs", nargs="*", default=[], help="extra BN1,BK1,BN2,HB,warps")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    configs = fused_mlp._CONFIGS + [tuple(int(v) for v in c.split(",")) for c in args.configs]
    for model in args.model:
        for m in args.m:
            for r in rows_for(model, m, configs):
                print(json.dumps(r), flush=True)
                if args.out:
                    with args.out.open("a") as f:
                        f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()

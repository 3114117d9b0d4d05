"""Lower bounds on the speed targets from measured kernel speeds (no GPU needed to run).

    python benchmarks/roofline.py --model llama-3.1-8b \\
        --linear docs/results/roofline_decode_gemms_h100.jsonl \\
        --attention-tb-s 3.0 --prefill-tok-s 43995

An engine that wastes nothing still runs, per decode step, the model's GEMMs at the step's
batch size and reads every running request's KV cache once. This takes the GEMM times that
`bench_linear.py` measured (cuBLAS, per batch size M, linearly interpolated between the
measured M), the best KV bandwidth `bench_decode_attention.py` measured for flashinfer's
decode kernels, and a prefill rate, and adds them up for:

- batch 1, input 128, output 1024: ms/token >= GEMMs(M=1) + KV(ctx ~640) / bandwidth;
- the nano-vllm workload (bench_offline_throughput --preset nano-vllm): all prompts
  prefilled, then decode step t (t = 1 .. max output - 1) runs the M_t requests with more
  than t output tokens to go, each reading input + t tokens of KV.

Norms, RoPE, activations, sampling and every gap between kernels are left out, so the
result is a bound no engine on these kernels can beat, not an estimate.

Without measured GEMMs, `--weights-tb-s` bounds any kernel: a decode step of M tokens reads
each weight it uses once at that bandwidth. For a mixture of experts a layer reads the
experts its M tokens chose: with each token taking k of E experts, E * (1 - (1 - k/E)^M)
of them on average (uniform routing). Example, Qwen3-30B-A3B (E 128, k 8): 8 experts at
M = 1, 82 at M = 16, 126 (98%) at M = 64. `--prefill-tok-s` is then the rate the bound
allows prefill, e.g. the card's dense bf16 peak over 2 x the active parameters:

    python benchmarks/roofline.py --model qwen3-30b-a3b --weights-tb-s 4.8 \\
        --attention-tb-s 4.8 --prefill-tok-s 150000
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_linear import config  # noqa: E402
from mini_sglang.bench_offline_throughput import nano_vllm_workload  # noqa: E402


def gemm_step_us(linear_jsonl: str, model: str) -> dict[int, float]:
    """Microseconds of one decode step's GEMMs (layers x per-layer + LM head) per measured M."""
    layers = config(model)["num_hidden_layers"]
    per_m: dict[int, float] = {}
    for line in Path(linear_jsonl).read_text().splitlines():
        r = json.loads(line)
        if r["model"] != model:
            continue
        per_m[r["m"]] = per_m.get(r["m"], 0.0) + r["us"] * (1 if r["gemm"] == "lm_head" else layers)
    if not per_m:
        raise SystemExit(f"no {model} rows in {linear_jsonl}")
    return dict(sorted(per_m.items()))


def interpolate(table: dict[int, float], m: int) -> float:
    """Piecewise-linear in M between measured points (clamped at the ends)."""
    ms = list(table)
    if m <= ms[0]:
        return table[ms[0]]
    for lo, hi in zip(ms, ms[1:]):
        if m <= hi:
            return table[lo] + (table[hi] - table[lo]) * (m - lo) / (hi - lo)
    return table[ms[-1]]


def kv_bytes_per_token(model: str) -> int:
    """K and V of one token over all layers, bf16."""
    c = config(model)
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return c["num_hidden_layers"] * 2 * c["num_key_value_heads"] * head_dim * 2


def weight_step_us(model: str, tb_s: float, max_m: int) -> dict[int, float]:
    """Microseconds to read one decode step's weights at tb_s TB/s, for M = 1 .. max_m
    (bf16; a mixture of experts reads the experts its M tokens chose, module docstring)."""
    c = config(model)
    h, layers = c["hidden_size"], c["num_hidden_layers"]
    qh, kvh = c["num_attention_heads"], c["num_key_value_heads"]
    d = c.get("head_dim") or h // qh
    experts = c.get("num_experts") or c.get("num_local_experts") or 0
    inter = c.get("moe_intermediate_size") or c["intermediate_size"]
    attn = (qh + 2 * kvh) * d * h + qh * d * h
    shared = 3 * h * c.get("shared_expert_intermediate_size", 0)
    expert = 3 * h * inter
    table = {}
    for m in range(1, max_m + 1):
        if experts:
            k = c["num_experts_per_tok"]
            read = experts * (1 - (1 - k / experts) ** m)
            mlp = experts * h + read * expert + shared  # the router, the chosen experts
        else:
            mlp = expert
        params = layers * (attn + mlp) + c["vocab_size"] * h  # the LM head
        table[m] = 2 * params / (tb_s * 1e6)
    return table


def batch1_bound_ms(gemm: dict[int, float], kv_tok: int, tb_s: float, in_len: int, out_len: int):
    mean_ctx = in_len + out_len / 2
    return (interpolate(gemm, 1) + kv_tok * mean_ctx / tb_s / 1e6) / 1000


def nano_vllm_bound(gemm: dict[int, float], kv_tok: int, tb_s: float, prefill_tok_s: float):
    """(seconds: prefill, decode GEMMs, decode KV reads; output tokens) of the workload.

    Request i (input I, output O) gets its first token from prefill and is in decode steps
    t = 1 .. O-1, where it reads I + t tokens of KV. Example: I=100, O=3 -> steps 1 and 2,
    reading 101 and 102 tokens.
    """
    prompts, params = nano_vllm_workload()
    ins = [len(p) for p in prompts]
    outs = [p["max_new_tokens"] for p in params]
    prefill_s = sum(ins) / prefill_tok_s
    gemm_s = kv_s = 0.0
    for t in range(1, max(outs)):
        running = [i for i, o in zip(ins, outs) if o - 1 >= t]
        gemm_s += interpolate(gemm, len(running)) / 1e6
        kv_s += kv_tok * sum(i + t for i in running) / (tb_s * 1e12)
    return prefill_s, gemm_s, kv_s, sum(outs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="llama-3.1-8b")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--linear", help="bench_linear.py --out JSONL")
    src.add_argument("--weights-tb-s", type=float, help="weights read once at this TB/s")
    ap.add_argument("--attention-tb-s", type=float, required=True, help="KV read bandwidth")
    ap.add_argument("--prefill-tok-s", type=float, required=True, help="prefill rate")
    args = ap.parse_args()
    if args.linear:
        gemm = gemm_step_us(args.linear, args.model)
    else:
        gemm = weight_step_us(args.model, args.weights_tb_s, len(nano_vllm_workload()[0]))
    kv_tok = kv_bytes_per_token(args.model)
    ms = batch1_bound_ms(gemm, kv_tok, args.attention_tb_s, 128, 1024)
    what = "GEMMs" if args.linear else "weight reads"
    print(
        f"{args.model}: decode {what} per step (us) by batch: "
        + ", ".join(f"{m}: {us:.0f}" for m, us in gemm.items() if m & (m - 1) == 0)
    )
    print(f"batch 1, in 128, out 1024: >= {ms:.3f} ms/token")
    pre, g, kv, out = nano_vllm_bound(gemm, kv_tok, args.attention_tb_s, args.prefill_tok_s)
    total = pre + g + kv
    print(
        f"nano-vllm workload: prefill {pre:.2f} s + decode GEMMs {g:.2f} s + KV reads {kv:.2f} s"
        f" = {total:.2f} s for {out} output tokens: <= {out / total:,.0f} tok/s"
    )


if __name__ == "__main__":
    main()

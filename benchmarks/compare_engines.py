"""Side-by-side decode latency and offline throughput: mini-sglang and a second engine.

    python benchmarks/compare_engines.py --model-dir /tmp/m/qwen3-0.6b [--out results.jsonl]

Runs mini-sglang's bench_one_batch (scheduler mode, batch 1, in 128, out 1024) and the
nano-vllm offline workload, then the same workloads on whichever second engine is importable
in this environment (sgl-project/mini-sglang as `minisgl`, SGLang as `sglang`, or vLLM),
each in its own subprocess so they never share GPU memory, and prints both side by side.
No second engine is a dependency of mini-sglang; when none is importable it says so.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys

SECOND_ENGINE_SNIPPETS = {
    # Each prints one JSON line {"decode_ms_per_token": ..., "output_tok_s": ...}.
    # sgl-project/mini-sglang, as its own benchmark/offline/bench.py configures it (flashinfer,
    # CUDA graphs to 256, page size 256), with dummy weights. Its sgl_kernel dependency is
    # only imported for the FA3 backend and MoE, so a copy of its python/ tree on PYTHONPATH
    # (plus msgpack) runs this driver. Its "auto" backend picks FA3 (sgl_kernel) for prefill
    # on Hopper, so flashinfer is named explicitly (as the targets were measured; an H100
    # run without it died with "sgl_kernel.flash_attn is not found"). Batch-1 decode: (1024 tokens - 1 token) / 1023.
    "minisgl": r"""
import json, random, time
from minisgl.core import SamplingParams
from minisgl.llm import LLM
llm = LLM(MODEL, max_seq_len_override=4096, max_extend_tokens=16384, cuda_graph_max_bs=256,
          page_size=256, use_dummy_weight=True, attention_backend="fi")
llm.generate([[1, 2, 3]], SamplingParams(temperature=0.1, max_tokens=8))  # warm-up
ids = [random.randint(0, 10000) for _ in range(128)]
def timed(n):
    t = time.perf_counter(); llm.generate([ids], SamplingParams(ignore_eos=True, max_tokens=n))
    return time.perf_counter() - t
dec = (timed(1024) - timed(1)) / 1023
random.seed(0)
P = [[random.randint(0, 10000) for _ in range(random.randint(100, 1024))] for _ in range(256)]
S = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=random.randint(100, 1024)) for _ in range(256)]
t = time.perf_counter(); llm.generate(P, S); d = time.perf_counter() - t
print(json.dumps({"decode_ms_per_token": 1000 * dec, "output_tok_s": sum(x.max_tokens for x in S) / d}))
""",
    "sglang": r"""
import json, random, time, sglang as sgl
llm = sgl.Engine(model_path=MODEL, load_format="dummy", context_length=4096)
ids = [random.randint(0, 10000) for _ in range(128)]
t = time.perf_counter(); llm.generate(input_ids=ids, sampling_params={"max_new_tokens": 1024, "ignore_eos": True, "temperature": 0})
dec = (time.perf_counter() - t) / 1024
random.seed(0)
P = [[random.randint(0, 10000) for _ in range(random.randint(100, 1024))] for _ in range(256)]
S = [{"temperature": 0.6, "ignore_eos": True, "max_new_tokens": random.randint(100, 1024)} for _ in range(256)]
t = time.perf_counter(); out = llm.generate(input_ids=P, sampling_params=S); d = time.perf_counter() - t
print(json.dumps({"decode_ms_per_token": 1000 * dec, "output_tok_s": sum(o["meta_info"]["completion_tokens"] for o in out) / d}))
""",
}


def run_ours(model_dir: str, extra_args: list[str]) -> dict:
    res: dict = {}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mini_sglang.bench_one_batch",
            "--model-path",
            model_dir,
            "--load-format",
            "dummy",
            "--batch-size",
            "1",
            "--input-len",
            "128",
            "--output-len",
            "1024",
            "--mode",
            "scheduler",
            *extra_args,
        ],
        capture_output=True,
        text=True,
    ).stdout
    for line in out.splitlines():
        if "ms/token" in line:
            res["decode_ms_per_token"] = float(line.split("decode ")[1].split(" ms")[0])
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mini_sglang.bench_offline_throughput",
            "--model-path",
            model_dir,
            "--load-format",
            "dummy",
            "--preset",
            "nano-vllm",
            *extra_args,
        ],
        capture_output=True,
        text=True,
    ).stdout
    for line in out.splitlines():
        if line.startswith("Output token throughput"):
            res["output_tok_s"] = float(line.split()[-1])
    return res


def run_second(model_dir: str) -> tuple[str, dict | None]:
    for name in ("minisgl", "sglang", "vllm"):
        if importlib.util.find_spec(name) is None:
            continue
        snippet = SECOND_ENGINE_SNIPPETS.get(name)
        if snippet is None:
            return name, {"error": f"{name} is importable but no driver is written for it"}
        code = f"MODEL = {model_dir!r}\n" + snippet
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
        return name, json.loads(lines[-1]) if lines else {"error": out.stderr[-2000:]}
    return "none", None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--only",
        choices=("both", "ours", "second"),
        default="both",
        help="run one side only (e.g. when device time is short); the other column shows nan",
    )
    ap.add_argument(
        "--ours-args",
        default="",
        help="server flags for mini-sglang's runs, e.g. '--chunked-prefill-size 16384' to "
        "match the second engine's 16384-token prefill batches",
    )
    args = ap.parse_args()
    ours = run_ours(args.model_dir, args.ours_args.split()) if args.only != "second" else {}
    name, theirs = run_second(args.model_dir) if args.only != "ours" else ("none", None)
    print(f"{'measure':<36}{'mini-sglang':>14}{name:>14}")
    for key in ("decode_ms_per_token", "output_tok_s"):
        other = theirs.get(key) if theirs else None
        print(f"{key:<36}{ours.get(key, float('nan')):>14.2f}{(other or float('nan')):>14.2f}")
    if theirs is None:
        print("No second engine (minisgl, sglang, vllm) is importable here.")
    elif "error" in theirs:
        print(f"{name}: {theirs['error']}")
    if args.out:
        with open(args.out, "a") as f:
            row = {"model": args.model_dir, "ours_args": args.ours_args, "ours": ours, name: theirs}
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()

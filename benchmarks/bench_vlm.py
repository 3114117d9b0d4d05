"""Qwen2.5-VL image serving: mini-sglang beside HF transformers' generate (GPU).

    python benchmarks/models/prepare.py qwen2.5-vl-7b /tmp/m/qwen2.5-vl-7b
    python benchmarks/bench_vlm.py --model-dir /tmp/m/qwen2.5-vl-7b --out /tmp/gpu_out/vlm.jsonl

Workload: SGLang 0.5.4 bench_serving's ``image`` dataset (random pixels, data URLs, a random
text prompt; mini_sglang.benchmark.datasets.sample_image_requests), default 16 requests of
one 720p image, 128 text tokens and 128 output tokens (range ratio 1: every request the
same lengths, so HF's padded batch wastes nothing). Weights are dummy on both sides (the
published config's shapes; mini-sglang --load-format dummy, transformers' random init).

1. mini-sglang: `launch_server --load-format dummy`, then the clone of SGLang's client
   (`--backend sglang-oai-chat`: the images go as image_url parts and the server's chat
   template places them) once with --max-concurrency 1 (single request: E2E latency, TTFT)
   and once with every request at once (batch: output throughput). With $SGLANG_SOURCE_DIR
   naming SGLang 0.5.4's unpacked package (and its client's imports, pybase64 and
   datasets, installed) SGLang's own bench_serving.py runs the batch workload too.
2. transformers (after the server has exited, in a fresh process): the same prompts and
   images through Qwen2_5_VLForConditionalGeneration.generate in bf16, one request alone
   and then all of them as one left-padded batch.
One JSON line per measurement goes to --out; a summary table is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from types import SimpleNamespace

import numpy as np

WORKLOAD = dict(
    dataset_name="image",
    image_count=1,
    image_resolution="720p",
    image_format="jpeg",
    image_content="random",
    random_input_len=128,
    random_output_len=128,
    random_range_ratio=1.0,
    seed=1,
)


def make_workload(model_dir: str, num_prompts: int, workload: dict) -> list:
    """The DatasetRows bench_serving sends (same seed, same rows)."""
    from mini_sglang.benchmark.datasets import load_processor, sample_image_requests

    random.seed(workload["seed"])
    np.random.seed(workload["seed"])
    return sample_image_requests(
        num_requests=num_prompts,
        image_count=workload["image_count"],
        input_len=workload["random_input_len"],
        output_len=workload["random_output_len"],
        range_ratio=workload["random_range_ratio"],
        processor=load_processor(model_dir),
        image_content=workload["image_content"],
        image_format=workload["image_format"],
        image_resolution=workload["image_resolution"],
    )


def wait_ready(port: int, proc: subprocess.Popen, timeout: float = 900.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}; see its log")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                return
        except OSError:
            time.sleep(2)
    raise SystemExit("the server did not come up")


def run_mini_sglang(args: argparse.Namespace, out: list[dict]) -> None:
    cmd = [sys.executable, "-m", "mini_sglang.launch_server", "--model-path", args.model_dir]
    cmd += ["--load-format", "dummy", "--port", str(args.port), *args.server_args.split()]
    with open(os.path.join(args.log_dir, "vlm_server.log"), "w") as log:
        server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        _bench_server(args, server, out)


def _bench_server(args: argparse.Namespace, server: subprocess.Popen, out: list[dict]) -> None:
    from mini_sglang.bench_serving import run_benchmark

    try:
        wait_ready(args.port, server)
        common = dict(
            WORKLOAD,
            backend="sglang-oai-chat",
            port=args.port,
            host="127.0.0.1",
            model=None,
            tokenizer=args.model_dir,
            disable_tqdm=True,
            output_file=os.path.join(args.log_dir, "vlm_serving.jsonl"),
        )
        for name, extra in (
            ("single", dict(num_prompts=args.single_prompts, max_concurrency=1)),
            ("batch", dict(num_prompts=args.num_prompts)),
        ):
            res = run_benchmark(SimpleNamespace(**common, **extra))
            out.append(
                {
                    "engine": "mini-sglang",
                    "mode": name,
                    "num_prompts": extra["num_prompts"],
                    "mean_e2e_latency_ms": res["mean_e2e_latency_ms"],
                    "mean_ttft_ms": res["mean_ttft_ms"],
                    "output_throughput": res["output_throughput"],
                    "completed": res["completed"],
                }
            )
        ref = os.environ.get("SGLANG_SOURCE_DIR")
        if ref and os.path.exists(os.path.join(ref, "bench_serving.py")):
            flags = ["--backend", "sglang-oai-chat", "--port", str(args.port)]
            flags += ["--tokenizer", args.model_dir, "--num-prompts", str(args.num_prompts)]
            for key, value in WORKLOAD.items():
                flags += ["--" + key.replace("_", "-"), str(value)]
            flags += ["--output-file", os.path.join(args.log_dir, "vlm_sglang_client.jsonl")]
            rc = subprocess.call([sys.executable, os.path.join(ref, "bench_serving.py"), *flags])
            out.append({"engine": "mini-sglang", "mode": "sglang-client", "returncode": rc})
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()


HF_SNIPPET = r"""
import json, pickle, sys, time, torch
from transformers import AutoConfig, Qwen2_5_VLForConditionalGeneration
from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl
from mini_sglang.multimodal.processors import get_mm_processor, get_processor
model_dir, workload_file = sys.argv[1], sys.argv[2]
rows = pickle.load(open(workload_file, "rb"))
config = AutoConfig.from_pretrained(model_dir)
parts = get_processor(model_dir)
proc = get_mm_processor(config, None, parts)
tok = parts.tokenizer
def inputs(row):
    content = [{"type": "image_url", "image_url": {"url": u}} for u in row.image_data]
    content.append({"type": "text", "text": row.prompt})
    text = tok.apply_chat_template([{"role": "user", "content": content}],
                                   add_generation_prompt=True, tokenize=False)
    return proc.process_mm_data(row.image_data, text, None)
dev = "cuda" if torch.cuda.is_available() else "cpu"
dtype = torch.bfloat16 if dev == "cuda" else torch.float32
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
with torch.device(dev):
    model = Qwen2_5_VLForConditionalGeneration._from_config(
        config, dtype=dtype, attn_implementation="sdpa")
model.eval()
processed = [inputs(r) for r in rows]
def batch(ps):
    n = max(len(p["input_ids"]) for p in ps)
    ids = torch.tensor([[0] * (n - len(p["input_ids"])) + p["input_ids"] for p in ps])
    mask = torch.tensor([[0] * (n - len(p["input_ids"])) + [1] * len(p["input_ids"]) for p in ps])
    items = [it for p in ps for it in p["mm_items"]]
    return dict(input_ids=ids.to(dev), attention_mask=mask.to(dev),
                pixel_values=torch.cat([it.feature for it in items]).to(dev, dtype),
                image_grid_thw=torch.cat([it.image_grid_thw for it in items]).to(dev),
                mm_token_type_ids=(ids == config.image_token_id).int().to(dev))
out_len = rows[0].output_len
def run(ps):
    model.model.rope_deltas = None
    kw = batch(ps)
    sync(); t = time.perf_counter()
    with torch.no_grad():
        out = model.generate(**kw, max_new_tokens=out_len, min_new_tokens=out_len,
                             do_sample=False, pad_token_id=0)
    sync()
    return time.perf_counter() - t, out.shape[1] - kw["input_ids"].shape[1]
run(processed[:1])  # warm-up
single = [run([p])[0] for p in processed[:SINGLE]]
dt, n = run(processed)
print(json.dumps({"engine": "transformers", "mode": "single", "num_prompts": SINGLE,
                  "mean_e2e_latency_ms": 1000 * sum(single) / len(single),
                  "output_throughput": out_len * len(single) / sum(single)}))
print(json.dumps({"engine": "transformers", "mode": "batch", "num_prompts": len(processed),
                  "mean_e2e_latency_ms": 1000 * dt, "output_throughput": n * len(processed) / dt}))
"""


def run_transformers(args: argparse.Namespace, rows: list, out: list[dict]) -> None:
    with tempfile.NamedTemporaryFile(suffix=".pkl", delete=False) as f:
        pickle.dump(rows, f)
    code = HF_SNIPPET.replace("SINGLE", str(args.single_prompts))
    res = subprocess.run(
        [sys.executable, "-c", code, args.model_dir, f.name], capture_output=True, text=True
    )
    os.unlink(f.name)
    if res.returncode != 0:
        print(res.stderr[-4000:], file=sys.stderr)
        out.append({"engine": "transformers", "error": res.stderr[-500:]})
        return
    out += [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-dir", required=True)
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--single-prompts", type=int, default=4, help="sequential single requests")
    p.add_argument("--port", type=int, default=30111)
    p.add_argument("--server-args", default="", help="extra launch_server flags")
    p.add_argument("--log-dir", default=tempfile.gettempdir())
    p.add_argument("--out", default=None, help="JSONL file the results are appended to")
    p.add_argument("--skip-hf", action="store_true")
    for key in ("image_count", "image_resolution", "random_input_len", "random_output_len"):
        p.add_argument("--" + key.replace("_", "-"), type=type(WORKLOAD[key]), default=None)
    args = p.parse_args()
    for key in ("image_count", "image_resolution", "random_input_len", "random_output_len"):
        if getattr(args, key) is not None:
            WORKLOAD[key] = getattr(args, key)
    rows = make_workload(args.model_dir, args.num_prompts, WORKLOAD)
    print(
        f"{len(rows)} requests: {rows[0].text_prompt_len} text + {rows[0].vision_prompt_len} "
        f"vision tokens in, {rows[0].output_len} out ({WORKLOAD['image_resolution']})"
    )
    results: list[dict] = []
    run_mini_sglang(args, results)
    if not args.skip_hf:
        run_transformers(args, rows, results)
    print(f"{'engine':<14} {'mode':<14} {'n':>4} {'E2E ms':>10} {'TTFT ms':>9} {'out tok/s':>10}")
    for r in results:
        print(
            f"{r.get('engine', ''):<14} {r.get('mode', ''):<14} {r.get('num_prompts', 0):>4} "
            f"{r.get('mean_e2e_latency_ms', float('nan')):>10.1f} "
            f"{r.get('mean_ttft_ms', float('nan')):>9.1f} "
            f"{r.get('output_throughput', float('nan')):>10.1f}"
        )
    if args.out:
        with open(args.out, "a") as f:
            for r in results:
                f.write(json.dumps(r | {"workload": WORKLOAD}) + "\n")


if __name__ == "__main__":
    main()

"""Radix prefix cache on CPU: bench_serving throughput with and without --disable-radix-cache.

Starts the real server on the default model (SmolLM2-135M, no --model-path) twice, once
with the radix cache and once with --disable-radix-cache, and runs
`python -m mini_sglang.bench_serving` against each with two datasets:

  generated-shared-prefix  groups of prompts sharing a long system prompt (cache hits)
  random-ids               unrelated prompts of about the same length (no hits: the
                           radix cache's bookkeeping cost, if any)

Each bench run starts with --flush-cache, so hits come only from within the run. The
prefill token counts (#new-token / #cached-token) are summed from the server's
"Prefill batch." log lines of that run.

On the GPU: pass the model with --server-args '--model-path DIR --load-format dummy'.

Usage:
  python benchmarks/bench_radix_cpu.py [--groups 4] [--per-group 8] [--system-len 512]
      [--question-len 32] [--output-len 16] [--port 31555]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

PREFILL_RE = re.compile(r"Prefill batch\. #new-seq: \d+, #new-token: (\d+), #cached-token: (\d+)")


def start_server(port: int, extra: list[str], log_path: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "mini_sglang.launch_server", "--port", str(port), *extra]
    print("$", " ".join(cmd[1:]), flush=True)
    with open(log_path, "wb") as log:  # the server writes to its own copy of the descriptor
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited during start-up; see {log_path}")
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                return proc
        except requests.RequestException:
            pass
        time.sleep(1)
    proc.kill()
    raise RuntimeError("server not healthy in time")


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_bench(port: int, dataset_args: list[str], out_file: Path, tokenizer: str) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "mini_sglang.bench_serving",
        "--backend",
        "sglang",
        "--port",
        str(port),
        "--tokenizer",
        tokenizer,
        "--flush-cache",
        "--disable-tqdm",
        "--seed",
        "1",
        "--output-file",
        str(out_file),
        *dataset_args,
    ]
    print("$", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out_file.read_text().splitlines()[-1])


def prefill_tokens(log_path: Path, start: int) -> tuple[int, int]:
    """(#new-token, #cached-token) summed over the prefill lines logged after byte start."""
    text = log_path.read_bytes()[start:].decode(errors="replace")
    new = cached = 0
    for m in PREFILL_RE.finditer(text):
        new += int(m.group(1))
        cached += int(m.group(2))
    return new, cached


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--per-group", type=int, default=8)
    p.add_argument("--system-len", type=int, default=512)
    p.add_argument("--question-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--port", type=int, default=31555)
    p.add_argument(
        "--server-args",
        default="",
        help="extra launch_server flags, e.g. '--model-path DIR --load-format dummy' (GPU runs)",
    )
    args = p.parse_args()
    n = args.groups * args.per_group
    datasets = {
        "generated-shared-prefix": [
            "--dataset-name",
            "generated-shared-prefix",
            "--gsp-num-groups",
            str(args.groups),
            "--gsp-prompts-per-group",
            str(args.per_group),
            "--gsp-system-prompt-len",
            str(args.system_len),
            "--gsp-question-len",
            str(args.question_len),
            "--gsp-output-len",
            str(args.output_len),
        ],
        "random-ids": [
            "--dataset-name",
            "random-ids",
            "--num-prompts",
            str(n),
            "--random-input-len",
            str(args.system_len + args.question_len),
            "--random-output-len",
            str(args.output_len),
            "--random-range-ratio",
            "1.0",
        ],
    }
    work = Path(tempfile.mkdtemp(prefix="bench_radix_"))
    rows = []
    for label, extra in (("radix", []), ("no-radix", ["--disable-radix-cache"])):
        log_path = work / f"server_{label}.log"
        proc = start_server(args.port, shlex.split(args.server_args) + extra, log_path)
        try:
            info = requests.get(f"http://127.0.0.1:{args.port}/get_server_info", timeout=30).json()
            for name, ds_args in datasets.items():
                start = log_path.stat().st_size
                rec = run_bench(
                    args.port, ds_args, work / f"{label}_{name}.jsonl", info["model_path"]
                )
                time.sleep(1.0)  # let the last log lines reach the file
                new, cached = prefill_tokens(log_path, start)
                rows.append((label, name, rec, new, cached))
            failures = requests.get(f"http://127.0.0.1:{args.port}/get_server_info", timeout=30)
            state = failures.json()["internal_states"][0]
            assert state["memory_check_failures"] == 0, state
        finally:
            stop_server(proc)

    print()
    print(f"torch threads: server default; cpu count {os.cpu_count()}; logs in {work}")
    header = (
        "| server | dataset | requests | duration s | req/s | input tok/s | output tok/s "
        "| mean TTFT ms | prefill computed | prefill cached |"
    )
    print(header)
    print("|" + "---|" * 10)
    for label, name, rec, new, cached in rows:
        print(
            f"| {label} | {name} | {rec['completed']} | {rec['duration']:.1f} "
            f"| {rec['request_throughput']:.2f} | {rec['input_throughput']:.0f} "
            f"| {rec['output_throughput']:.1f} | {rec['mean_ttft_ms']:.0f} | {new} | {cached} |"
        )


if __name__ == "__main__":
    main()

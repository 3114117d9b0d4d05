"""Offline throughput through the Engine (SGLang's bench_offline_throughput).

    python -m mini_sglang.bench_offline_throughput --model-path DIR --load-format dummy \\
        --preset nano-vllm
    python -m mini_sglang.bench_offline_throughput --model-path DIR --num-prompts 64 \\
        --random-input-len 256 --random-output-len 128

The nano-vllm preset is nano-vllm's bench.py workload: 256 sequences, Python's random seeded
with 0, token ids uniform in [0, 10000], input and output lengths uniform in [100, 1024],
temperature 0.6, ignore_eos, context length 4096.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from mini_sglang.server_args import ServerArgs


def nano_vllm_workload(num_seqs: int = 256, max_input: int = 1024, max_output: int = 1024):
    random.seed(0)
    prompts = [
        [random.randint(0, 10000) for _ in range(random.randint(100, max_input))]
        for _ in range(num_seqs)
    ]
    params = [
        {"temperature": 0.6, "ignore_eos": True, "max_new_tokens": random.randint(100, max_output)}
        for _ in range(num_seqs)
    ]
    return prompts, params


def random_workload(n: int, input_len: int, output_len: int, vocab: int, seed: int):
    rng = random.Random(seed)
    prompts = [[rng.randint(0, vocab - 1) for _ in range(input_len)] for _ in range(n)]
    params = [{"temperature": 0.0, "ignore_eos": True, "max_new_tokens": output_len}] * n
    return prompts, params


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ServerArgs.add_cli_args(parser)
    parser.add_argument("--preset", choices=["nano-vllm"], default=None)
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--random-input-len", type=int, default=256)
    parser.add_argument("--random-output-len", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--result-filename", type=str, default=None)
    args = parser.parse_args(argv)
    if args.preset == "nano-vllm" and args.context_length is None:
        args.context_length = 4096
    server_args = ServerArgs.from_cli_args(args)
    # Local: Engine imports torch and the process machinery, which --help does not need.
    from mini_sglang.entrypoints.engine import Engine

    engine = Engine(server_args=server_args)
    try:
        if args.preset == "nano-vllm":
            prompts, params = nano_vllm_workload()
        else:
            vocab = engine.tokenizer_manager.model_config.vocab_size
            prompts, params = random_workload(
                args.num_prompts, args.random_input_len, args.random_output_len, vocab, args.seed
            )
        engine.generate(input_ids=prompts[0], sampling_params={"max_new_tokens": 8})  # warm-up
        t0 = time.perf_counter()
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        duration = time.perf_counter() - t0
    except BaseException:
        engine.shutdown()
        raise
    # Report before shutting the engine down, so a failure in teardown cannot lose the run.
    n_in = sum(len(p) for p in prompts)
    n_out = sum(o["meta_info"]["completion_tokens"] for o in outs)
    result = {
        "successful_requests": len(outs),
        "duration_s": duration,
        "total_input_tokens": n_in,
        "total_output_tokens": n_out,
        "request_throughput": len(outs) / duration,
        "input_throughput": n_in / duration,
        "output_throughput": n_out / duration,
        "total_throughput": (n_in + n_out) / duration,
        "preset": args.preset,
        "model_path": server_args.model_path,
    }
    print("\n{s:=^50}".format(s=" Offline Throughput Benchmark Result "))
    print("{:<40} {:<10}".format("Successful requests:", result["successful_requests"]))
    print("{:<40} {:<10.2f}".format("Benchmark duration (s):", duration))
    print("{:<40} {:<10}".format("Total input tokens:", n_in))
    print("{:<40} {:<10}".format("Total generated tokens:", n_out))
    print("{:<40} {:<10.2f}".format("Request throughput (req/s):", result["request_throughput"]))
    print("{:<40} {:<10.2f}".format("Input token throughput (tok/s):", result["input_throughput"]))
    print(
        "{:<40} {:<10.2f}".format("Output token throughput (tok/s):", result["output_throughput"])
    )
    print("{:<40} {:<10.2f}".format("Total token throughput (tok/s):", result["total_throughput"]))
    print("=" * 50)
    if args.result_filename:
        with open(args.result_filename, "a") as f:
            f.write(json.dumps(result) + "\n")
    engine.shutdown()
    return result


if __name__ == "__main__":
    main()

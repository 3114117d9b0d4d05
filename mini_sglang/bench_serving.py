"""Online serving benchmark, a compact clone of SGLang 0.5.4 ``sglang.bench_serving``.

Usage:
    python -m mini_sglang.bench_serving --backend sglang --dataset-name random-ids \
        --num-prompts 100 --random-input-len 512 --random-output-len 128

Contract: same flags/defaults, workload, request payloads, SSE parsing, printed
"Serving Benchmark Result" block and JSONL record as SGLang 0.5.4. Additions: a readiness
wait on ``/v1/models`` (``--ready-check-timeout-sec``, from 0.5.23), no network downloads
(sharegpt/random need ``--dataset-path``), and ``run_benchmark(args) -> dict`` for scripts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime
from typing import Any

import aiohttp
import numpy as np
from tqdm.asyncio import tqdm

from mini_sglang.benchmark.backends import (
    ASYNC_REQUEST_FUNCS,
    DEFAULT_PORTS,
    RequestFuncInput,
    RequestFuncOutput,
    api_path,
    async_request_profile,
    get_auth_headers,
)
from mini_sglang.benchmark.datasets import DatasetRow, get_dataset
from mini_sglang.benchmark.metrics import build_result, calculate_metrics, format_report

DATASETS = ["sharegpt", "random", "random-ids", "generated-shared-prefix", "image"]


def _http_get_json(url: str, timeout: float = 10.0) -> tuple[int, Any]:
    """GET ``url``; return (status, parsed JSON or None). Raises on connection errors."""
    req = urllib.request.Request(url, headers=get_auth_headers())
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, None


def wait_for_server(base_url: str, timeout_s: float) -> None:
    """Poll ``GET {base}/v1/models`` once a second until 200 (0.5.23); 0 skips the wait."""
    if timeout_s <= 0:
        return
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if _http_get_json(f"{base_url}/v1/models", timeout=5.0)[0] == 200:
                return
        except (OSError, ValueError):
            pass  # Not listening yet, or a half-started server: keep polling.
        if time.monotonic() >= deadline:
            raise RuntimeError(f"Server at {base_url} not ready after {timeout_s:.0f}s")
        time.sleep(1.0)


async def get_request(rows: list[DatasetRow], request_rate: float):
    """Yield rows; between them sleep Exp(1/rate) drawn from ``np.random`` (none if inf)."""
    for row in rows:
        yield row
        if request_rate == float("inf"):
            continue
        await asyncio.sleep(np.random.exponential(1.0 / request_rate))


async def _server_accept_length(base_url: str) -> float | None:
    """``internal_states[0].avg_spec_accept_length`` from ``/get_server_info`` if present."""
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(base_url + "/get_server_info", headers=get_auth_headers()) as r,
        ):
            if r.status != 200:
                return None
            body = await r.read()
    except aiohttp.ClientError:
        return None  # Do not throw away a finished run over an optional statistic.
    info = json.loads(body)  # A 200 must be valid JSON, as for SGLang.
    if "decode" in info:  # PD-disaggregated router: look at the first decode worker.
        info = info["decode"][0]
    states = info.get("internal_states")
    return states[0].get("avg_spec_accept_length") if states else None


async def benchmark(
    args: argparse.Namespace,
    api_url: str,
    base_url: str,
    model_id: str,
    tokenizer: Any,
    input_requests: list[DatasetRow],
    extra_request_body: dict[str, Any],
) -> dict[str, Any]:
    """Warm up, optionally flush, dispatch all requests, print the report, append JSONL."""
    backend = args.backend
    request_func = ASYNC_REQUEST_FUNCS[backend]
    semaphore = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None
    lora_names = args.lora_name or []

    def make_input(row: DatasetRow, output_len: int, lora: str | None) -> RequestFuncInput:
        return RequestFuncInput(
            prompt=row.prompt,
            api_url=api_url,
            prompt_len=row.prompt_len,
            output_len=output_len,
            model=model_id,
            lora_name=lora,
            image_data=row.image_data,
            extra_request_body=extra_request_body,
            timestamp=row.timestamp,
            stream=not args.disable_stream,
            ignore_eos=not args.disable_ignore_eos,
            return_logprob=args.return_logprob,
        )

    async def limited(inp: RequestFuncInput, pbar: Any) -> RequestFuncOutput:
        if semaphore is None:
            return await request_func(inp, pbar)
        async with semaphore:
            return await request_func(inp, pbar)

    print(f"Starting warmup with {args.warmup_requests} sequences...")
    first = input_requests[0]
    warm_in = make_input(first, min(first.output_len, 32), lora_names[0] if lora_names else None)
    warm_out = await asyncio.gather(
        *[request_func(warm_in, None) for _ in range(args.warmup_requests)]
    )
    if args.warmup_requests > 0 and not any(o.success for o in warm_out):
        raise ValueError(
            "Warmup failed - Please make sure benchmark arguments "
            f"are correctly specified. Error: {warm_out[0].error}"
        )
    print(f"Warmup completed with {args.warmup_requests} sequences. Starting main benchmark run...")

    if args.flush_cache:
        async with (
            aiohttp.ClientSession() as session,
            session.post(base_url + "/flush_cache", headers=get_auth_headers()) as r,
        ):
            await r.read()
    await asyncio.sleep(1.0)  # Same settle time as SGLang before the timed run.

    if args.profile:
        print("Starting profiler...")
        if (await async_request_profile(base_url + "/start_profile")).success:
            print("Profiler started")

    start = time.perf_counter()
    pbar = None if args.disable_tqdm else tqdm(total=len(input_requests))
    tasks: list[asyncio.Task[RequestFuncOutput]] = []
    async for row in get_request(input_requests, args.request_rate):
        # SGLang picks a LoRA per request with the seeded Python RNG.
        lora = lora_names[random.randint(0, len(lora_names) - 1)] if lora_names else None
        tasks.append(asyncio.create_task(limited(make_input(row, row.output_len, lora), pbar)))
    outputs = await asyncio.gather(*tasks)

    if args.profile:
        print("Stopping profiler...")
        if (await async_request_profile(base_url + "/stop_profile")).success:
            print("Profiler stopped")
    if pbar is not None:
        pbar.close()
    accept_length = await _server_accept_length(base_url) if "sglang" in backend else None

    duration = time.perf_counter() - start
    metrics, output_lens = calculate_metrics(input_requests, outputs, duration, tokenizer)
    print(
        format_report(
            backend, args.request_rate, args.max_concurrency, duration, metrics, accept_length
        )
    )
    result = build_result(
        args, args.request_rate, args.max_concurrency, duration, metrics, accept_length
    )
    details = {
        "input_lens": [o.prompt_len for o in outputs],
        "output_lens": output_lens,
        "ttfts": [o.ttft for o in outputs],
        "itls": [o.itl for o in outputs],
        "generated_texts": [o.generated_text for o in outputs],
        "errors": [o.error for o in outputs],
    }
    with open(default_output_file(args), "a") as f:
        f.write(json.dumps(result | details if args.output_details else result) + "\n")
    return result | details


def default_output_file(args: argparse.Namespace) -> str:
    """``--output-file``, else SGLang's ``{backend}_{MMDD}_{n}_{in}_{out}.jsonl`` naming."""
    if args.output_file:
        return args.output_file
    now = datetime.now().strftime("%m%d")
    if args.dataset_name == "image":
        return (
            f"{args.backend}_{now}_{args.num_prompts}_{args.random_input_len}_"
            f"{args.random_output_len}_{args.image_count}imgs_{args.image_resolution}.jsonl"
        )
    if args.dataset_name.startswith("random"):
        return (
            f"{args.backend}_{now}_{args.num_prompts}_{args.random_input_len}_"
            f"{args.random_output_len}.jsonl"
        )
    return f"{args.backend}_{now}_{args.num_prompts}_{args.dataset_name}.jsonl"


def set_ulimit(target_soft_limit: int = 65535) -> None:
    """Raise RLIMIT_NOFILE: one socket per in-flight request."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < target_soft_limit:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(target_soft_limit, hard), hard))
        except ValueError as e:
            print(f"Fail to set RLIMIT_NOFILE: {e}")


def _fill_defaults(args: Any) -> argparse.Namespace:
    """Accept partial namespaces (e.g. SimpleNamespace from scripts): add parser defaults."""
    full = vars(build_parser().parse_args([]))
    full.update(vars(args))
    return argparse.Namespace(**full)


def run_benchmark(args_: Any) -> dict[str, Any]:
    """Run one benchmark as ``python -m mini_sglang.bench_serving`` would; return metrics.

    The dict holds the JSONL record keys plus per-request details (input_lens, output_lens,
    ttfts, itls, generated_texts, errors). Seeds ``random`` and ``np.random`` with ``--seed``.
    """
    args = _fill_defaults(args_)
    print(f"benchmark_args={args}")
    set_ulimit()
    random.seed(args.seed)
    np.random.seed(args.seed)
    extra_request_body = json.loads(args.extra_request_body) if args.extra_request_body else {}
    if args.tokenize_prompt:
        assert args.backend == "sglang", (
            "`--tokenize-prompt` only compatible with `--backend sglang` currently"
        )
    if args.dataset_name == "image":
        args.apply_chat_template = True
        assert not args.tokenize_prompt, "`--tokenize-prompt` not compatible with image dataset"
    if args.backend not in ASYNC_REQUEST_FUNCS:
        raise ValueError(f"Unknown backend: {args.backend}")
    if args.port is None:
        args.port = DEFAULT_PORTS.get(args.backend, 30000)
    base_url = args.base_url or f"http://{args.host}:{args.port}"
    api_url = base_url + api_path(args.backend)

    wait_for_server(base_url, args.ready_check_timeout_sec)
    if args.model is None:
        model_url = f"{base_url}/v1/models"
        try:
            models = (_http_get_json(model_url)[1] or {}).get("data", [])
            args.model = models[0]["id"] if models else None
        except Exception as e:
            print(f"Failed to fetch model from {model_url}. Error: {e}")
            print("Please specify the correct host and port using `--host` and `--port`.")
            sys.exit(1)
    if args.model is None:
        print("No model specified or found. Please provide a model using `--model`.")
        sys.exit(1)

    from transformers import AutoTokenizer  # Deferred: slow import, not needed for --help.

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.model, trust_remote_code=True)
    if "chat_template" not in tokenizer.init_kwargs and not getattr(
        tokenizer, "chat_template", None
    ):
        print(
            "\nWARNING It is recommended to use the `Chat` or `Instruct` model for benchmarking.\n"
            "Because when the tokenizer counts the output tokens, if there is gibberish, "
            "it might count incorrectly.\n"
        )
    print(f"{args}\n")
    input_requests = get_dataset(args, tokenizer)
    return asyncio.run(
        benchmark(
            args, api_url, base_url, args.model, tokenizer, input_requests, extra_request_body
        )
    )


def build_parser() -> argparse.ArgumentParser:
    """SGLang 0.5.4's flags and defaults (its datasets but mmmu), plus
    --ready-check-timeout-sec."""
    p = argparse.ArgumentParser(description="Benchmark the online serving throughput.")
    a = p.add_argument
    a("--backend", type=str, choices=list(ASYNC_REQUEST_FUNCS), default="sglang")
    a("--base-url", type=str, default=None, help="Server base url; overrides host/port.")
    a("--host", type=str, default="0.0.0.0")
    a("--port", type=int, default=None, help="Default depends on the backend (sglang: 30000).")
    a("--dataset-name", type=str, default="sharegpt", choices=DATASETS)
    a("--dataset-path", type=str, default="", help="Path to the ShareGPT JSON.")
    a("--model", type=str, default=None, help="Default: data[0].id of GET /v1/models.")
    a("--tokenizer", type=str, default=None, help="Default: the model id.")
    a("--num-prompts", type=int, default=1000)
    a("--sharegpt-output-len", type=int, default=None)
    a("--sharegpt-context-len", type=int, default=None)
    a("--random-input-len", type=int, default=1024)
    a("--random-output-len", type=int, default=1024)
    a("--random-range-ratio", type=float, default=0.0)
    a("--request-rate", type=float, default=float("inf"), help="Poisson rate; inf = all at once.")
    a("--max-concurrency", type=int, default=None)
    a("--output-file", type=str, default=None, help="JSONL file the record is appended to.")
    a("--output-details", action="store_true")
    a("--disable-tqdm", action="store_true")
    a("--disable-stream", action="store_true")
    a("--return-logprob", action="store_true")
    a("--seed", type=int, default=1)
    a("--disable-ignore-eos", action="store_true")
    a("--extra-request-body", type=str, default=None, metavar='{"key1": "value1"}')
    a("--apply-chat-template", action="store_true")
    a("--profile", action="store_true", help="POST /start_profile and /stop_profile.")
    a("--lora-name", type=str, nargs="*", default=None)
    a("--prompt-suffix", type=str, default="")
    a("--flush-cache", action="store_true", help="POST /flush_cache before the run.")
    a("--warmup-requests", type=int, default=1)
    a("--tokenize-prompt", action="store_true", help="Send input_ids (sglang backend only).")
    a("--ready-check-timeout-sec", type=float, default=60.0, help="0 skips the wait.")
    g = p.add_argument_group("image dataset arguments").add_argument
    g("--image-count", type=int, default=1, help="Images per request.")
    g("--image-resolution", type=str, default="1080p", help="4k/1080p/720p/360p or HxW.")
    g("--image-format", type=str, default="jpeg", help="jpeg or png.")
    g("--image-content", type=str, default="random", help="random or blank.")
    g = p.add_argument_group("generated-shared-prefix dataset arguments").add_argument
    g("--gsp-num-groups", type=int, default=64)
    g("--gsp-prompts-per-group", type=int, default=16)
    g("--gsp-system-prompt-len", type=int, default=2048)
    g("--gsp-question-len", type=int, default=128)
    g("--gsp-output-len", type=int, default=256)
    return p


def main(argv: list[str] | None = None) -> None:
    """CLI entry: a missing dataset file is a one-line error, not a traceback."""
    try:
        run_benchmark(build_parser().parse_args(argv))
    except FileNotFoundError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()

"""Metrics, the printed "Serving Benchmark Result" block, and the JSONL record.

Contract: numbers, labels, order and formatting match SGLang 0.5.4 ``bench_serving``
(``calculate_metrics`` and the report in ``benchmark``).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mini_sglang.benchmark.backends import RequestFuncOutput
from mini_sglang.benchmark.datasets import DatasetRow


@dataclass
class BenchmarkMetrics:
    """Aggregates over successful requests; latencies in ms, throughputs per second."""

    completed: int
    total_input: int
    total_input_text: int
    total_input_vision: int
    total_output: int
    total_output_retokenized: int
    request_throughput: float
    input_throughput: float
    output_throughput: float
    output_throughput_retokenized: float
    total_throughput: float
    total_throughput_retokenized: float
    mean_ttft_ms: float
    median_ttft_ms: float
    std_ttft_ms: float
    p99_ttft_ms: float
    mean_tpot_ms: float
    median_tpot_ms: float
    std_tpot_ms: float
    p99_tpot_ms: float
    mean_itl_ms: float
    median_itl_ms: float
    std_itl_ms: float
    p95_itl_ms: float
    p99_itl_ms: float
    max_itl_ms: float
    mean_e2e_latency_ms: float
    median_e2e_latency_ms: float
    std_e2e_latency_ms: float
    p99_e2e_latency_ms: float
    concurrency: float


def calculate_metrics(
    input_requests: Sequence[DatasetRow],
    outputs: Sequence[RequestFuncOutput],
    dur_s: float,
    tokenizer: Any,
) -> tuple[BenchmarkMetrics, list[int]]:
    """Return the metrics and per-request output lengths (0 for failed requests).

    TPOT = (latency - ttft) / (output_len - 1) for outputs longer than one token. Empty
    TTFT/ITL/TPOT lists count as 0 (non-streaming backends), like SGLang's ``x or 0``.
    """
    output_lens: list[int] = []
    retok_lens: list[int] = []
    total_input = total_input_text = total_input_vision = completed = 0
    itls: list[float] = []
    tpots: list[float] = []
    ttfts: list[float] = []
    e2e: list[float] = []
    for row, out in zip(input_requests, outputs):
        if not out.success:
            output_lens.append(0)
            retok_lens.append(0)
            continue
        output_lens.append(out.output_len)
        retok_lens.append(len(tokenizer.encode(out.generated_text, add_special_tokens=False)))
        total_input += row.prompt_len
        total_input_text += row.text_prompt_len or 0
        total_input_vision += row.vision_prompt_len or 0
        if out.output_len > 1:
            tpots.append((out.latency - out.ttft) / (out.output_len - 1))
        itls += out.itl
        ttfts.append(out.ttft)
        e2e.append(out.latency)
        completed += 1

    if completed == 0:
        warnings.warn(
            "All requests failed. This is likely due to a misconfiguration "
            "on the benchmark arguments.",
            stacklevel=2,
        )
    total_output, total_retok = sum(output_lens), sum(retok_lens)
    with warnings.catch_warnings():
        # All-failed runs give NaN e2e stats, as in SGLang; numpy's warning adds nothing.
        warnings.simplefilter("ignore", RuntimeWarning)
        e2e_arr = np.asarray(e2e, dtype=float)
        metrics = BenchmarkMetrics(
            completed=completed,
            total_input=total_input,
            total_input_text=total_input_text,
            total_input_vision=total_input_vision,
            total_output=total_output,
            total_output_retokenized=total_retok,
            request_throughput=completed / dur_s,
            input_throughput=total_input / dur_s,
            output_throughput=total_output / dur_s,
            output_throughput_retokenized=total_retok / dur_s,
            total_throughput=(total_input + total_output) / dur_s,
            total_throughput_retokenized=(total_input + total_retok) / dur_s,
            mean_ttft_ms=np.mean(ttfts or 0) * 1000,
            median_ttft_ms=np.median(ttfts or 0) * 1000,
            std_ttft_ms=np.std(ttfts or 0) * 1000,
            p99_ttft_ms=np.percentile(ttfts or 0, 99) * 1000,
            mean_tpot_ms=np.mean(tpots or 0) * 1000,
            median_tpot_ms=np.median(tpots or 0) * 1000,
            std_tpot_ms=np.std(tpots or 0) * 1000,
            p99_tpot_ms=np.percentile(tpots or 0, 99) * 1000,
            mean_itl_ms=np.mean(itls or 0) * 1000,
            median_itl_ms=np.median(itls or 0) * 1000,
            std_itl_ms=np.std(itls or 0) * 1000,
            p95_itl_ms=np.percentile(itls or 0, 95) * 1000,
            p99_itl_ms=np.percentile(itls or 0, 99) * 1000,
            max_itl_ms=np.max(itls or 0) * 1000,
            mean_e2e_latency_ms=np.mean(e2e_arr) * 1000,
            median_e2e_latency_ms=np.median(e2e_arr) * 1000,
            std_e2e_latency_ms=np.std(e2e_arr) * 1000,
            p99_e2e_latency_ms=(np.percentile(e2e_arr, 99) if e2e else float("nan")) * 1000,
            concurrency=np.sum(e2e_arr) / dur_s,
        )
    return metrics, output_lens


def _row(label: str, value: Any, fmt: str = "") -> str:
    return ("{:<40} {:<10" + fmt + "}").format(label, value)


def format_report(
    backend: str,
    request_rate: float | str,
    max_concurrency: int | None,
    duration: float,
    m: BenchmarkMetrics,
    accept_length: float | None = None,
) -> str:
    """The exact text block SGLang prints (lines joined with newlines, leading blank line)."""
    f2 = ".2f"
    lines = [
        "\n{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="),
        _row("Backend:", backend),
        _row("Traffic request rate:", request_rate),
        _row("Max request concurrency:", max_concurrency if max_concurrency else "not set"),
        _row("Successful requests:", m.completed),
        _row("Benchmark duration (s):", duration, f2),
        _row("Total input tokens:", m.total_input),
        _row("Total input text tokens:", m.total_input_text),
        _row("Total input vision tokens:", m.total_input_vision),
        _row("Total generated tokens:", m.total_output),
        _row("Total generated tokens (retokenized):", m.total_output_retokenized),
        _row("Request throughput (req/s):", m.request_throughput, f2),
        _row("Input token throughput (tok/s):", m.input_throughput, f2),
        _row("Output token throughput (tok/s):", m.output_throughput, f2),
        _row("Total token throughput (tok/s):", m.total_throughput, f2),
        _row("Concurrency:", m.concurrency, f2),
    ]
    if accept_length:
        lines.append(_row("Accept length:", accept_length, f2))
    sections = [
        ("End-to-End Latency", [("Mean E2E Latency (ms):", m.mean_e2e_latency_ms),
                                ("Median E2E Latency (ms):", m.median_e2e_latency_ms)]),
        ("Time to First Token", [("Mean TTFT (ms):", m.mean_ttft_ms),
                                 ("Median TTFT (ms):", m.median_ttft_ms),
                                 ("P99 TTFT (ms):", m.p99_ttft_ms)]),
        ("Inter-Token Latency", [("Mean ITL (ms):", m.mean_itl_ms),
                                 ("Median ITL (ms):", m.median_itl_ms),
                                 ("P95 ITL (ms):", m.p95_itl_ms),
                                 ("P99 ITL (ms):", m.p99_itl_ms),
                                 ("Max ITL (ms):", m.max_itl_ms)]),
    ]  # fmt: skip
    for title, rows in sections:
        lines.append("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        lines += [_row(label, value, f2) for label, value in rows]
    lines.append("=" * 50)
    return "\n".join(lines)


def build_result(
    args: Any,
    request_rate: float | str,
    max_concurrency: int | None,
    duration: float,
    m: BenchmarkMetrics,
    accept_length: float | None,
) -> dict[str, Any]:
    """The JSONL record, same keys and order as SGLang 0.5.4."""
    return {
        "backend": args.backend,
        "dataset_name": args.dataset_name,
        "request_rate": request_rate,
        "max_concurrency": max_concurrency,
        "sharegpt_output_len": args.sharegpt_output_len,
        "random_input_len": args.random_input_len,
        "random_output_len": args.random_output_len,
        "random_range_ratio": args.random_range_ratio,
        "duration": duration,
        "completed": m.completed,
        "total_input_tokens": m.total_input,
        "total_input_text_tokens": m.total_input_text,
        "total_input_vision_tokens": m.total_input_vision,
        "total_output_tokens": m.total_output,
        "total_output_tokens_retokenized": m.total_output_retokenized,
        "request_throughput": m.request_throughput,
        "input_throughput": m.input_throughput,
        "output_throughput": m.output_throughput,
        "mean_e2e_latency_ms": m.mean_e2e_latency_ms,
        "median_e2e_latency_ms": m.median_e2e_latency_ms,
        "std_e2e_latency_ms": m.std_e2e_latency_ms,
        "p99_e2e_latency_ms": m.p99_e2e_latency_ms,
        "mean_ttft_ms": m.mean_ttft_ms,
        "median_ttft_ms": m.median_ttft_ms,
        "std_ttft_ms": m.std_ttft_ms,
        "p99_ttft_ms": m.p99_ttft_ms,
        "mean_tpot_ms": m.mean_tpot_ms,
        "median_tpot_ms": m.median_tpot_ms,
        "std_tpot_ms": m.std_tpot_ms,
        "p99_tpot_ms": m.p99_tpot_ms,
        "mean_itl_ms": m.mean_itl_ms,
        "median_itl_ms": m.median_itl_ms,
        "std_itl_ms": m.std_itl_ms,
        "p95_itl_ms": m.p95_itl_ms,
        "p99_itl_ms": m.p99_itl_ms,
        "concurrency": m.concurrency,
        "accept_length": accept_length,
    }

"""Timing a GPU callable with CUDA events (for kernel selection and micro-benchmarks)."""

from __future__ import annotations

from collections.abc import Callable

import torch


def cuda_time_ms(fn: Callable[[], object], iters: int = 20, warmup: int = 1) -> float:
    """Mean milliseconds per call of `fn` on the current stream: `warmup` untimed calls,
    then `iters` calls queued back to back between two events, so launch latency hides
    behind the previous call as it does inside a decode step."""
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters

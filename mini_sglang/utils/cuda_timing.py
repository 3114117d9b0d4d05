"""Timing a GPU callable with CUDA events (for kernel selection and micro-benchmarks)."""

from __future__ import annotations

from collections.abc import Callable

import torch


def cuda_time_ms(
    fn: Callable[[], object], iters: int = 20, warmup: int = 1, graph: bool = False
) -> float:
    """Mean milliseconds per call of `fn` on the current stream: `warmup` untimed calls,
    then `iters` calls queued back to back between two events, so launch latency hides
    behind the previous call as it does inside a decode step.

    With graph=True the `iters` calls are captured in one CUDA graph and its replay is
    timed: the GPU time of the kernels alone, as in a CUDA-graph decode step. Without it a
    kernel shorter than its host launch (~10-20 us from Python) is timed at launch speed:
    a 3 us GEMV measured 16 us."""
    for _ in range(warmup):
        fn()
    if graph:
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(iters):
                fn()
        g.replay()  # warm
        run = g.replay
        calls = 1
    else:
        run = fn
        calls = iters
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters

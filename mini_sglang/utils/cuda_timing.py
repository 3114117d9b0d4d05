"""Timing a GPU callable with CUDA events (for kernel selection and micro-benchmarks)."""

from __future__ import annotations

from collections.abc import Callable

import torch

_flush_ms: dict[tuple[int, int], float] = {}


def _l2_flush_buffer() -> torch.Tensor:
    """Twice the L2 in bytes: reading it evicts everything an earlier kernel left there."""
    l2 = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0)
    return torch.empty(max(2 * l2, 64 << 20) // 2, dtype=torch.bfloat16, device="cuda")


def _time(run: Callable[[], object], calls: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def _graph(fn: Callable[[], object], iters: int) -> torch.cuda.CUDAGraph:
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(iters):
            fn()
    g.replay()  # warm
    return g


def cuda_time_ms(
    fn: Callable[[], object],
    iters: int = 20,
    warmup: int = 1,
    graph: bool = False,
    cold_l2: bool = False,
) -> float:
    """Mean milliseconds per call of `fn` on the current stream: `warmup` untimed calls,
    then `iters` calls queued back to back between two events, so launch latency hides
    behind the previous call as it does inside a decode step.

    With graph=True the `iters` calls are captured in one CUDA graph and its replay is
    timed: the GPU time of the kernels alone, as in a CUDA-graph decode step. Without it a
    kernel shorter than its host launch (~10-20 us from Python) is timed at launch speed:
    a 3 us GEMV measured 16 us.

    cold_l2=True (implies graph) reads a buffer twice the L2's size before every call and
    subtracts a graph of those reads alone, so `fn` finds its inputs in HBM, as a decode
    step's GEMV finds its weight (the step streams ~GBs of weights through a 50 MB L2).
    With one weight that fits in L2 a hot timing measures L2, not HBM, bandwidth."""
    for _ in range(warmup):
        fn()
    if not (graph or cold_l2):
        return _time(fn, iters) / iters
    if not cold_l2:
        return _time(_graph(fn, iters).replay, 1) / iters
    flush = _l2_flush_buffer()
    sums = torch.empty((), dtype=torch.float32, device="cuda")

    def flush_l2() -> None:
        torch.sum(flush, dim=0, dtype=torch.float32, out=sums)

    both = _graph(lambda: (flush_l2(), fn()), iters)
    # best of three replays: a replay is ~1 ms, so one stray clock or scheduling hiccup
    # would otherwise decide a pick
    t_both = min(_time(both.replay, 1) for _ in range(3))
    key = (torch.cuda.current_device(), iters)
    if key not in _flush_ms:  # the reads alone, once per device and length
        alone = _graph(flush_l2, iters)
        _flush_ms[key] = min(_time(alone.replay, 1) for _ in range(3))
    return max(t_both - _flush_ms[key], 0.0) / iters

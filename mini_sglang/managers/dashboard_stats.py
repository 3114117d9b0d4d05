"""What /dashboard/data reports: the TokenizerManager's recent latencies and token counts,
its in-flight requests, and the schedulers' state, in one JSON-ready snapshot.

``DashboardStats.on_output`` runs once per output message of a request (where the
TokenizerManager already folds it in) and costs O(1): it adds the new tokens to a per-second
bucket and appends at most one TTFT or ITL sample to a bounded deque. Nothing else runs until
someone asks for a snapshot, so a server nobody watches pays only that. ``snapshot`` reads
the buckets of the last ``window_s`` seconds (throughput, radix hit rate) and the samples of
that window (TTFT / ITL percentiles), lists the in-flight requests, and merges every DP
replica's internal state (``Scheduler.internal_state``, asked for when the snapshot is).
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any

# How many recent TTFT / ITL samples are kept (older ones fall off even inside the window).
MAX_SAMPLES = 4096
# Rows of the in-flight table (oldest first); the total count is always reported.
MAX_INFLIGHT_ROWS = 100


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) of `values` by linear interpolation; None if empty."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


class DashboardStats:
    """Token counts per second and recent TTFT / ITL samples, seen by the TokenizerManager.

    ``window_s``: the sliding window (seconds) of throughput, hit rate and percentiles.
    Per-request progress lives on the request's state (``dash_tokens``, ``dash_last_time``).
    """

    def __init__(self, window_s: float = 60.0, rate_window_s: float = 5.0) -> None:
        self.window_s = window_s
        self.rate_window_s = rate_window_s
        # [second, generated tokens, prompt tokens, cached tokens, finished requests]
        self._buckets: deque[list] = deque()
        self._ttft: deque[tuple[float, float]] = deque(maxlen=MAX_SAMPLES)
        self._itl: deque[tuple[float, float]] = deque(maxlen=MAX_SAMPLES)
        self.generation_tokens_total = 0
        self.prompt_tokens_total = 0
        self.cached_tokens_total = 0
        self.num_requests_total = 0
        self.start_time = time.time()

    def _bucket(self, now: float) -> list:
        sec = int(now)
        if not self._buckets or self._buckets[-1][0] != sec:
            self._buckets.append([sec, 0, 0, 0, 0])
            while self._buckets and self._buckets[0][0] < sec - self.window_s:
                self._buckets.popleft()
        return self._buckets[-1]

    def on_output(self, state: Any, meta_info: dict, finished: bool, now: float) -> None:
        """Account one output message of a request: its new completion tokens, one TTFT
        sample (first tokens) or one ITL sample (the mean gap of this message's tokens),
        and on its last message its prompt and cached tokens."""
        done = meta_info["completion_tokens"]
        new = done - state.dash_tokens
        if new > 0:
            if state.dash_tokens == 0:
                self._ttft.append((now, now - state.created_time))
            elif state.dash_last_time is not None:
                self._itl.append((now, (now - state.dash_last_time) / new))
            self._bucket(now)[1] += new
            self.generation_tokens_total += new
            state.dash_tokens = done
            state.dash_last_time = now
        if finished:
            prompt, cached = meta_info["prompt_tokens"], meta_info["cached_tokens"]
            bucket = self._bucket(now)
            bucket[2] += prompt
            bucket[3] += cached
            bucket[4] += 1
            self.prompt_tokens_total += prompt
            self.cached_tokens_total += cached
            self.num_requests_total += 1

    def _sums(self, since: float) -> list[int]:
        out = [0, 0, 0, 0]
        for b in self._buckets:
            if b[0] >= since:
                for i in range(4):
                    out[i] += b[i + 1]
        return out

    def _latency(self, samples: deque, now: float) -> dict[str, Any]:
        xs = [v for t, v in samples if t >= now - self.window_s]
        return {
            "count": len(xs),
            "p50": percentile(xs, 50),
            "p90": percentile(xs, 90),
            "p99": percentile(xs, 99),
        }

    def tokenizer_side(self, now: float) -> dict[str, Any]:
        """Throughput, hit rate and latency percentiles over the window (seconds, tok/s)."""
        rate_since = int(now) - self.rate_window_s
        gen_recent = self._sums(rate_since)[0]
        gen, prompt, cached, finished = self._sums(int(now) - self.window_s)
        return {
            "window_s": self.window_s,
            "gen_throughput": gen_recent / max(now - rate_since, 1e-9),
            "generation_tokens_window": gen,
            "prompt_tokens_window": prompt,
            "cached_tokens_window": cached,
            "finished_requests_window": finished,
            "cache_hit_rate_window": cached / prompt if prompt else None,
            "totals": {
                "generation_tokens": self.generation_tokens_total,
                "prompt_tokens": self.prompt_tokens_total,
                "cached_tokens": self.cached_tokens_total,
                "requests": self.num_requests_total,
            },
            "ttft_s": self._latency(self._ttft, now),
            "itl_s": self._latency(self._itl, now),
        }


def inflight_table(rid_to_state: dict[str, Any], now: float) -> dict[str, Any]:
    """The requests the TokenizerManager holds, oldest first: rid, prompt tokens (once the
    scheduler reported them, else the tokenized input's length or None), output tokens so
    far, age in seconds, streaming or not."""
    rows = []
    for rid, state in rid_to_state.items():
        meta = state.meta_info or {}
        prompt = meta.get("prompt_tokens")
        if prompt is None:
            ids = getattr(state.obj, "input_ids", None)
            prompt = len(ids) if isinstance(ids, list) and ids and isinstance(ids[0], int) else None
        rows.append(
            {
                "rid": rid,
                "prompt_tokens": prompt,
                "output_tokens": meta.get("completion_tokens", 0),
                "age_s": round(now - state.created_time, 3),
                "stream": bool(getattr(state.obj, "stream", False)),
            }
        )
    rows.sort(key=lambda r: -r["age_s"])
    return {"count": len(rows), "rows": rows[:MAX_INFLIGHT_ROWS]}


def merge_schedulers(internal_states: list[dict[str, Any]]) -> dict[str, Any]:
    """Every DP replica's internal state summed into one (running, queued, KV slots by
    kind, the scheduler's last logged throughput), with the per-replica numbers kept.
    KV: used + evictable + free == capacity, where used counts the slots requests hold."""
    replicas = []
    for s in internal_states:
        mem = s.get("memory_accounting", {})
        capacity = mem.get("capacity", s.get("max_total_num_tokens", 0))
        free, evictable = mem.get("free", 0), mem.get("evictable", 0)
        replicas.append(
            {
                "num_running_reqs": s.get("num_running_reqs", 0),
                "num_queue_reqs": s.get("num_queue_reqs", 0),
                "num_grammar_queue_reqs": s.get("num_grammar_queue_reqs", 0),
                "kv": {
                    "capacity": capacity,
                    "used": capacity - free - evictable,
                    "evictable": evictable,
                    "free": free,
                },
                "last_gen_throughput": s.get("last_gen_throughput", 0.0),
                "num_retracted_reqs": s.get("num_retracted_reqs", 0),
            }
        )
    total: dict[str, Any] = {
        k: sum(r[k] for r in replicas)
        for k in (
            "num_running_reqs",
            "num_queue_reqs",
            "num_grammar_queue_reqs",
            "last_gen_throughput",
            "num_retracted_reqs",
        )
    }
    total["kv"] = {
        k: sum(r["kv"][k] for r in replicas) for k in ("capacity", "used", "evictable", "free")
    }
    total["replicas"] = replicas
    return total

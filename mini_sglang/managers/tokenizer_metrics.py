"""Prometheus metrics served at /metrics (`--enable-metrics`), with SGLang's `sglang:*` names.

Request-level counters and latency histograms are updated by the TokenizerManager as outputs
arrive (`on_output`); scheduler gauges (running / queued requests, token usage, throughput)
are read from the scheduler's internal state when /metrics is scraped, so the scheduler's
loop does no metrics work at all.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                    7.5, 10.0, 15.0, 20.0, 30.0, 40.0, 60.0, 120.0, 300.0)  # fmt: skip
_ITL_BUCKETS = (0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
                0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)  # fmt: skip


class ServerMetrics:
    """The server's Prometheus registry; ``on_output`` per request output, ``render`` per
    scrape."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.labels = {"model_name": model_name}
        names = ["model_name"]

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, names, registry=self.registry)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, names, registry=self.registry)

        def histogram(name: str, doc: str, buckets: tuple) -> Histogram:
            return Histogram(name, doc, names, buckets=buckets, registry=self.registry)

        self.prompt_tokens = counter("sglang:prompt_tokens", "Prefill tokens processed.")
        self.generation_tokens = counter("sglang:generation_tokens", "Generation tokens.")
        self.cached_tokens = counter("sglang:cached_tokens", "Prompt tokens served from cache.")
        self.num_requests = counter("sglang:num_requests", "Requests finished.")
        self.ttft = histogram(
            "sglang:time_to_first_token_seconds", "Time to first token.", _LATENCY_BUCKETS
        )
        self.itl = histogram(
            "sglang:inter_token_latency_seconds", "Time between output tokens.", _ITL_BUCKETS
        )
        self.e2e = histogram(
            "sglang:e2e_request_latency_seconds", "End-to-end request latency.", _LATENCY_BUCKETS
        )
        self.num_running_reqs = gauge("sglang:num_running_reqs", "Running requests.")
        self.num_queue_reqs = gauge("sglang:num_queue_reqs", "Waiting requests.")
        self.num_used_tokens = gauge("sglang:num_used_tokens", "KV slots in use.")
        self.token_usage = gauge("sglang:token_usage", "Fraction of KV slots in use.")
        self.gen_throughput = gauge("sglang:gen_throughput", "Generation tokens per second.")
        self.cache_hit_rate = gauge("sglang:cache_hit_rate", "Prompt tokens served from cache.")
        self.num_retracted_reqs = gauge("sglang:num_retracted_reqs", "Requests retracted.")
        self._prompt_total = 0
        self._cached_total = 0

    def on_output(self, state: Any, meta_info: dict, finished: bool) -> None:
        """Account one output message of a request (called in the TokenizerManager)."""
        now = time.time()
        done = meta_info["completion_tokens"]
        new = done - state.metric_tokens
        if new > 0:
            if state.metric_tokens == 0:
                self.ttft.labels(**self.labels).observe(now - state.created_time)
            elif state.metric_last_time is not None:
                gap = (now - state.metric_last_time) / new
                for _ in range(new):
                    self.itl.labels(**self.labels).observe(gap)
            self.generation_tokens.labels(**self.labels).inc(new)
            state.metric_tokens = done
            state.metric_last_time = now
        if finished:
            prompt, cached = meta_info["prompt_tokens"], meta_info["cached_tokens"]
            self.prompt_tokens.labels(**self.labels).inc(prompt)
            self.cached_tokens.labels(**self.labels).inc(cached)
            self._prompt_total += prompt
            self._cached_total += cached
            self.num_requests.labels(**self.labels).inc()
            self.e2e.labels(**self.labels).observe(now - state.created_time)

    def render(self, internal_state: dict) -> bytes:
        """Prometheus text exposition, after refreshing the scheduler gauges."""
        s, lb = internal_state, self.labels
        self.num_running_reqs.labels(**lb).set(s.get("num_running_reqs", 0))
        self.num_queue_reqs.labels(**lb).set(s.get("num_queue_reqs", 0))
        self.num_used_tokens.labels(**lb).set(s.get("num_used_tokens", 0))
        self.token_usage.labels(**lb).set(s.get("token_usage", 0.0))
        self.gen_throughput.labels(**lb).set(s.get("last_gen_throughput", 0.0))
        self.num_retracted_reqs.labels(**lb).set(s.get("num_retracted_reqs", 0))
        rate = self._cached_total / self._prompt_total if self._prompt_total else 0.0
        self.cache_hit_rate.labels(**lb).set(rate)
        return generate_latest(self.registry)

"""Prometheus metrics served at /metrics (`--enable-metrics`): every metric SGLang 0.5.4's
TokenizerMetricsCollector and SchedulerMetricsCollector export (srt/metrics/collector.py),
with the same names, types, label names and default buckets.

Request-level counters and latency histograms (label ``model_name``) are updated by the
TokenizerManager as outputs arrive (`on_output`, `on_abort`); the scheduler's metrics
(labels ``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank``, and ``dp_rank`` with
several DP replicas) are set from each replica's internal state when /metrics is scraped,
so the scheduler's loop does no metrics work at all. Metrics of features mini-sglang does
not have (speculative decoding, PD disaggregation, SWA, offline batches, async weight sync,
grammar tree traversal) are exported at 0, as SGLang reports them when unused.
"""

from __future__ import annotations

import time
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# SGLang's export (multi-process mode) has no `_created` samples.
prometheus_client.disable_created_metrics()

# TokenizerMetricsCollector's default buckets.
_TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
_E2E_BUCKETS = _TTFT_BUCKETS + (600, 1200, 1800, 2400)
_ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040,
                0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0)  # fmt: skip
# SchedulerMetricsCollector's buckets.
_QUEUE_TIME_BUCKETS = (0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80,
                       90, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400,
                       1600, 1800, 2000, 2500, 3000)  # fmt: skip
_GRAMMAR_TIME_BUCKETS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60, 90,
                         120, 240)  # fmt: skip
_SCHEMA_COUNT_BUCKETS = (0, 1, 2, 5, 10, 20, 30, 40, 60, 80, 100, 120, 140, 160, 180, 200, 300,
                         400, 500, 700, 1000)  # fmt: skip
_EBNF_SIZE_BUCKETS = (0, 50, 100, 200, 300, 500, 1000, 2000, 3000, 5000, 10000, 20000, 30000,
                      50000, 100000)  # fmt: skip
_TRAVERSAL_BUCKETS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 90, 120,
                      240)  # fmt: skip
# exponential_buckets(start=0.001, width=1.62, length=30)
_STAGE_BUCKETS = tuple(0.001 * 1.62**i for i in range(30))

# Scheduler gauges: name -> (documentation, the internal-state key that holds the value or
# None for a feature mini-sglang lacks, which stays 0).
_SCHEDULER_GAUGES: dict[str, tuple[str, str | None]] = {
    "num_running_reqs": ("The number of running requests.", "num_running_reqs"),
    "num_used_tokens": ("The number of used tokens.", "num_used_tokens"),
    "token_usage": ("The token usage.", "token_usage"),
    "pending_prealloc_token_usage": (
        "The token usage for pending preallocated tokens (not preallocated yet).",
        None,
    ),
    "swa_token_usage": ("The token usage for SWA layers.", None),
    "gen_throughput": ("The generation throughput (token/s).", "last_gen_throughput"),
    "num_queue_reqs": ("The number of requests in the waiting queue.", "num_queue_reqs"),
    "num_grammar_queue_reqs": (
        "The number of requests in the grammar waiting queue.",
        "num_grammar_queue_reqs",
    ),
    "num_running_reqs_offline_batch": (
        "The number of running low-priority offline batch requests(label is 'batch').",
        None,
    ),
    "cache_hit_rate": ("The prefix cache hit rate.", None),  # set from the request totals
    "spec_accept_length": ("The average acceptance length of speculative decoding.", None),
    "spec_accept_rate": (
        "The average acceptance rate of speculative decoding (`accepted tokens / total "
        "draft tokens` in batch).",
        None,
    ),
    "num_retracted_reqs": ("The number of retracted requests.", "num_retracted_reqs"),
    "num_paused_reqs": ("The number of paused requests by async weight sync.", None),
    "num_prefill_prealloc_queue_reqs": (
        "The number of requests in the prefill prealloc queue.",
        None,
    ),
    "num_prefill_inflight_queue_reqs": (
        "The number of requests in the prefill inflight queue.",
        None,
    ),
    "num_decode_prealloc_queue_reqs": (
        "The number of requests in the decode prealloc queue.",
        None,
    ),
    "num_decode_transfer_queue_reqs": (
        "The number of requests in the decode transfer queue.",
        None,
    ),
    "kv_transfer_speed_gb_s": ("The transfer speed of the KV cache in GB/s.", None),
    "kv_transfer_latency_ms": ("The transfer latency of the KV cache in ms.", None),
    "utilization": ("The utilization.", None),
    "max_running_requests_under_SLO": ("The maximum number of running requests under SLO.", None),
    "engine_startup_time": ("The time taken for the engine to start up.", None),
    "engine_load_weights_time": ("The time taken for the engine to load weights.", None),
    "is_cuda_graph": ("Whether the batch is using CUDA graph.", None),
}
_SCHEDULER_COUNTERS: dict[str, str] = {
    "num_bootstrap_failed_reqs_total": "The number of bootstrap failed requests.",
    "num_transfer_failed_reqs_total": "The number of transfer failed requests.",
    "num_grammar_cache_hit_total": "Number of grammar cache hits.",
    "num_grammar_aborted_total": "Number of grammar aborted requests.",
    "num_grammar_total": "Number of the total grammar requests.",
}
_SCHEDULER_HISTOGRAMS: dict[str, tuple[str, tuple]] = {
    "queue_time_seconds": ("Histogram of queueing time in seconds.", _QUEUE_TIME_BUCKETS),
    "grammar_compilation_time_seconds": (
        "Histogram of grammar compilation time in seconds.",
        _GRAMMAR_TIME_BUCKETS,
    ),
    "grammar_schema_count": ("Histogram of grammar schema count.", _SCHEMA_COUNT_BUCKETS),
    "grammar_ebnf_size": ("Histogram of grammar EBNF size.", _EBNF_SIZE_BUCKETS),
    "grammar_tree_traversal_time_avg": (
        "Histogram of average grammar tree traversal time in seconds.",
        _TRAVERSAL_BUCKETS,
    ),
    "grammar_tree_traversal_time_max": (
        "Histogram of max grammar tree traversal time in seconds.",
        _TRAVERSAL_BUCKETS,
    ),
}
_GRAMMAR_KEYS = ("json_schema", "regex", "ebnf", "structural_tag")


class ServerMetrics:
    """The server's Prometheus registry; ``on_output`` per request output, ``on_abort`` per
    abort sent to the scheduler, ``render`` per scrape."""

    def __init__(self, model_name: str, dp_size: int = 1) -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        self.labels = {"model_name": model_name}
        self._init_tokenizer_metrics()
        self._init_scheduler_metrics(dp_size)
        self._prompt_total = 0
        self._cached_total = 0

    def _init_tokenizer_metrics(self) -> None:
        names, reg = ["model_name"], self.registry

        def counter(name: str, doc: str) -> Counter:
            c = Counter(f"sglang:{name}", doc, names, registry=reg)
            c.labels(**self.labels)  # exported (at 0) before the first request
            return c

        def histogram(name: str, doc: str, buckets: tuple) -> Histogram:
            h = Histogram(f"sglang:{name}", doc, names, buckets=buckets, registry=reg)
            h.labels(**self.labels)
            return h

        self.prompt_tokens = counter("prompt_tokens_total", "Number of prefill tokens processed.")
        self.generation_tokens = counter(
            "generation_tokens_total", "Number of generation tokens processed."
        )
        self.cached_tokens = counter("cached_tokens_total", "Number of cached prompt tokens.")
        self.num_requests = counter("num_requests_total", "Number of requests processed.")
        self.num_so_requests = counter(
            "num_so_requests_total", "Number of structured output requests processed."
        )
        self.num_aborted_requests = counter(
            "num_aborted_requests_total", "Number of requests aborted."
        )
        self.ttft = histogram(
            "time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            _TTFT_BUCKETS,
        )
        self.itl = histogram(
            "inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            _ITL_BUCKETS,
        )
        self.e2e = histogram(
            "e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            _E2E_BUCKETS,
        )

    def _init_scheduler_metrics(self, dp_size: int) -> None:
        names = ["model_name", "engine_type", "tp_rank", "pp_rank"]
        if dp_size > 1:
            names.append("dp_rank")
        reg = self.registry
        self.scheduler_labels = [
            {"model_name": self.model_name, "engine_type": "unified", "tp_rank": "0",
             "pp_rank": "0", **({"dp_rank": str(r)} if dp_size > 1 else {})}
            for r in range(dp_size)
        ]  # fmt: skip
        self.gauges = {
            name: Gauge(f"sglang:{name}", doc, names, registry=reg, multiprocess_mode="mostrecent")
            for name, (doc, _) in _SCHEDULER_GAUGES.items()
        }
        metrics: list[Any] = list(self.gauges.values())
        for name, doc in _SCHEDULER_COUNTERS.items():
            metrics.append(Counter(f"sglang:{name}", doc, names, registry=reg))
        for name, (doc, buckets) in _SCHEDULER_HISTOGRAMS.items():
            metrics.append(Histogram(f"sglang:{name}", doc, names, buckets=buckets, registry=reg))
        for metric in metrics:
            for lb in self.scheduler_labels:
                metric.labels(**lb)
        # Labelled by stage too; a stage appears once observed.
        Histogram(
            "sglang:per_stage_req_latency_seconds",
            "The latency of each stage of requests.",
            [*names, "stage"],
            buckets=_STAGE_BUCKETS,
            registry=reg,
        )

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
            self._on_finished(state, meta_info, now)

    def _on_finished(self, state: Any, meta_info: dict, now: float) -> None:
        prompt, cached = meta_info["prompt_tokens"], meta_info["cached_tokens"]
        self.prompt_tokens.labels(**self.labels).inc(prompt)
        self.cached_tokens.labels(**self.labels).inc(cached)
        self._prompt_total += prompt
        self._cached_total += cached
        self.num_requests.labels(**self.labels).inc()
        sp = getattr(state.obj, "sampling_params", None)
        if isinstance(sp, dict) and any(sp.get(k) for k in _GRAMMAR_KEYS):
            self.num_so_requests.labels(**self.labels).inc()
        self.e2e.labels(**self.labels).observe(now - state.created_time)

    def on_abort(self) -> None:
        """An abort sent to the scheduler (SGLang counts each one)."""
        self.num_aborted_requests.labels(**self.labels).inc()

    def render(self, internal_states: list[dict]) -> bytes:
        """Prometheus text exposition, after refreshing the scheduler gauges from every DP
        replica's internal state (in dp-rank order)."""
        rate = self._cached_total / self._prompt_total if self._prompt_total else 0.0
        for lb, s in zip(self.scheduler_labels, internal_states):
            for name, (_, key) in _SCHEDULER_GAUGES.items():
                if key is not None:
                    self.gauges[name].labels(**lb).set(s.get(key, 0))
            self.gauges["cache_hit_rate"].labels(**lb).set(rate)
        return generate_latest(self.registry)

"""/metrics: Prometheus text with SGLang's names, counting what the server really did; and
/dashboard (its page, assets and data) on the same servers: conftest's shared
`metrics_server` (--enable-metrics --api-key k) and the default `server`."""

from __future__ import annotations

import json
import re
import threading
import time

import requests

from tests.server.conftest import ServerHandle


def _value(text: str, name: str) -> float:
    m = re.search(rf'^{re.escape(name)}\{{[^}}]*model_name="[^"]*"[^}}]*\}} (\S+)$', text, re.M)
    assert m, f"{name} missing from /metrics"
    return float(m.group(1))


def test_metrics_count_requests_and_tokens(metrics_server: ServerHandle) -> None:
    auth = {"Authorization": "Bearer k"}
    before = metrics_server.get("/metrics").text  # /metrics needs no api key
    base_requests = _value(before, "sglang:num_requests_total")
    base_prompt = _value(before, "sglang:prompt_tokens_total")
    base_gen = _value(before, "sglang:generation_tokens_total")
    bodies = [
        {
            "input_ids": [5, 6, 7, 8],
            "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True},
            "stream": s,
        }
        for s in (False, True)
    ]
    for body in bodies:
        r = metrics_server.post("/generate", json=body, headers=auth)
        assert r.status_code == 200
    text = metrics_server.get("/metrics").text
    assert _value(text, "sglang:num_requests_total") == base_requests + 2
    assert _value(text, "sglang:prompt_tokens_total") == base_prompt + 8
    assert _value(text, "sglang:generation_tokens_total") == base_gen + 12
    # One TTFT and one e2e observation per request; the streamed request's 6 tokens give 5
    # inter-token gaps (a non-streamed request reaches the front end in one message).
    assert _value(text, "sglang:time_to_first_token_seconds_count") >= 2
    assert _value(text, "sglang:e2e_request_latency_seconds_count") >= 2
    assert _value(text, "sglang:inter_token_latency_seconds_count") >= 5
    # The scheduler updates its gauges after the batch that finished the request, which can
    # be a moment after the response reached the client: wait for the idle state.
    deadline = time.monotonic() + 10
    while _value(text, "sglang:num_running_reqs") != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
        text = metrics_server.get("/metrics").text
    assert _value(text, "sglang:num_running_reqs") == 0
    assert _value(text, "sglang:num_queue_reqs") == 0
    # The second identical prompt hit the radix cache (all but its last token).
    assert _value(text, "sglang:cache_hit_rate") > 0
    for name in ("sglang:token_usage", "sglang:gen_throughput", "sglang:num_used_tokens"):
        _value(text, name)


def test_metrics_disabled_by_default(server: ServerHandle) -> None:
    r = server.get("/metrics")
    assert r.status_code == 404
    assert "--enable-metrics" in r.json()["error"]["message"]


# Every metric SGLang 0.5.4 exports (srt/metrics/collector.py: TokenizerMetricsCollector with
# its defaults, then SchedulerMetricsCollector): family name as the text format's TYPE line
# spells it (a counter's with _total) -> (type, label names).
_TOKENIZER = ("model_name",)
_SCHEDULER = ("model_name", "engine_type", "tp_rank", "pp_rank")
SGLANG_054_METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    **{
        f"sglang:{name}_total": ("counter", _TOKENIZER)
        for name in ("prompt_tokens", "generation_tokens", "cached_tokens", "num_requests",
                     "num_so_requests", "num_aborted_requests")
    },
    **{
        f"sglang:{name}": ("histogram", _TOKENIZER)
        for name in ("time_to_first_token_seconds", "inter_token_latency_seconds",
                     "e2e_request_latency_seconds")
    },
    **{
        f"sglang:{name}": ("gauge", _SCHEDULER)
        for name in ("num_running_reqs", "num_used_tokens", "token_usage",
                     "pending_prealloc_token_usage", "swa_token_usage", "gen_throughput",
                     "num_queue_reqs", "num_grammar_queue_reqs",
                     "num_running_reqs_offline_batch", "cache_hit_rate", "spec_accept_length",
                     "spec_accept_rate", "num_retracted_reqs", "num_paused_reqs",
                     "num_prefill_prealloc_queue_reqs", "num_prefill_inflight_queue_reqs",
                     "num_decode_prealloc_queue_reqs", "num_decode_transfer_queue_reqs",
                     "kv_transfer_speed_gb_s", "kv_transfer_latency_ms", "utilization",
                     "max_running_requests_under_SLO", "engine_startup_time",
                     "engine_load_weights_time", "is_cuda_graph")
    },
    **{
        f"sglang:{name}_total": ("counter", _SCHEDULER)
        for name in ("num_bootstrap_failed_reqs", "num_transfer_failed_reqs",
                     "num_grammar_cache_hit", "num_grammar_aborted", "num_grammar")
    },
    **{
        f"sglang:{name}": ("histogram", _SCHEDULER)
        for name in ("queue_time_seconds", "grammar_compilation_time_seconds",
                     "grammar_schema_count", "grammar_ebnf_size",
                     "grammar_tree_traversal_time_avg", "grammar_tree_traversal_time_max")
    },
    "sglang:per_stage_req_latency_seconds": ("histogram", (*_SCHEDULER, "stage")),
}  # fmt: skip


def test_metrics_are_sglangs_full_list(metrics_server: ServerHandle) -> None:
    """Every family of SGLang 0.5.4's collectors, with its type and label names (read from
    the samples; per_stage_req_latency_seconds has none until a stage is observed), and
    the queue gauges SGLang names (grammar queue, speculative accept length) present."""
    text = metrics_server.get("/metrics").text
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    assert types == {name: kind for name, (kind, _) in SGLANG_054_METRICS.items()}
    labels: dict[str, set[str]] = {}
    for sample, body in re.findall(r"^(sglang:[^{\s]+)\{([^}]*)\}", text, re.M):
        family = sample if sample in types else re.sub(r"_(bucket|sum|count)$", "", sample)
        labels.setdefault(family, set()).update(
            k for k in re.findall(r'(\w+)="', body) if k != "le"
        )
    for name, (_, names) in SGLANG_054_METRICS.items():
        if name != "sglang:per_stage_req_latency_seconds":
            assert labels.get(name) == set(names), name
    assert "_created" not in text  # SGLang's multi-process export has none
    assert _value(text, "sglang:num_grammar_queue_reqs") == 0
    assert _value(text, "sglang:spec_accept_length") == 0


# ---- /dashboard (on the same servers: no server start of its own) -------------------------
DASH_AUTH = {"Authorization": "Bearer k"}


def _data(server: ServerHandle, headers: dict | None = None) -> dict:
    r = server.get("/dashboard/data", headers=headers or {})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    return r.json()


def test_dashboard_data_counts_tokens_and_adds_up_kv(metrics_server: ServerHandle) -> None:
    assert metrics_server.get("/dashboard/data").status_code == 401  # the data needs the key
    before = _data(metrics_server, DASH_AUTH)["tokenizer"]["totals"]
    body = {
        "input_ids": [9, 10, 11, 12, 13],
        "sampling_params": {"max_new_tokens": 7, "temperature": 0, "ignore_eos": True},
    }
    for stream in (False, True):
        r = metrics_server.post("/generate", json={**body, "stream": stream}, headers=DASH_AUTH)
        assert r.status_code == 200
    d = _data(metrics_server, DASH_AUTH)
    tok = d["tokenizer"]
    assert tok["totals"]["generation_tokens"] == before["generation_tokens"] + 14
    assert tok["totals"]["prompt_tokens"] == before["prompt_tokens"] + 10
    assert tok["totals"]["requests"] == before["requests"] + 2
    assert tok["generation_tokens_window"] >= 14
    # The second identical prompt hit the radix cache.
    assert tok["cached_tokens_window"] > 0 and 0 < tok["cache_hit_rate_window"] <= 1
    assert tok["ttft_s"]["count"] >= 2 and tok["ttft_s"]["p50"] > 0
    assert tok["ttft_s"]["p50"] <= tok["ttft_s"]["p90"] <= tok["ttft_s"]["p99"]
    # The streamed request's 7 tokens came in several messages: ITL samples.
    assert tok["itl_s"]["count"] >= 1 and tok["itl_s"]["p99"] > 0
    assert tok["gen_throughput"] >= 0
    sch = d["scheduler"]
    kv = sch["kv"]
    info = metrics_server.get("/get_server_info", headers=DASH_AUTH).json()
    assert kv["capacity"] == info["max_total_num_tokens"]
    assert kv["used"] + kv["evictable"] + kv["free"] == kv["capacity"]
    assert kv["evictable"] > 0  # the prompts stay cached
    assert len(sch["replicas"]) == 1 and sch["num_queue_reqs"] == 0
    srv = d["server"]
    assert srv["enable_metrics"] is True and srv["dp_size"] == 1
    assert srv["device_name"] and srv["max_total_num_tokens"] == kv["capacity"]
    assert srv["flags"]["enable_metrics"] is True
    assert "api_key" not in srv["flags"] and '"k"' not in json.dumps(srv)


def test_dashboard_lists_a_streaming_request_in_flight(metrics_server: ServerHandle) -> None:
    assert metrics_server.post(
        "/slow_down", json={"forward_sleep_time": 0.05}, headers=DASH_AUTH
    ).ok
    got_first = threading.Event()
    done = threading.Event()

    def stream() -> None:
        body = {
            "rid": "dash-inflight",
            "input_ids": [3, 4, 5, 6],
            "sampling_params": {"max_new_tokens": 60, "temperature": 0, "ignore_eos": True},
            "stream": True,
        }
        with requests.post(
            metrics_server.base_url + "/generate",
            json=body,
            headers=DASH_AUTH,
            stream=True,
            timeout=120,
        ) as r:
            for line in r.iter_lines():
                if line.startswith(b"data: {"):
                    got_first.set()
        done.set()

    t = threading.Thread(target=stream, daemon=True)
    t.start()
    try:
        assert got_first.wait(60)
        rows = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not done.is_set():
            d = _data(metrics_server, DASH_AUTH)
            rows = [r for r in d["inflight"]["rows"] if r["rid"] == "dash-inflight"]
            if rows and rows[0]["output_tokens"] >= 1:
                break
            time.sleep(0.05)
        assert rows, "the streaming request is missing from the in-flight table"
        row = rows[0]
        assert row["prompt_tokens"] == 4 and 1 <= row["output_tokens"] < 60
        assert row["age_s"] > 0 and row["stream"] is True
        assert d["inflight"]["count"] >= 1 and d["scheduler"]["num_running_reqs"] >= 1
        assert d["scheduler"]["kv"]["used"] > 0
    finally:
        metrics_server.post("/slow_down", json={"forward_sleep_time": None}, headers=DASH_AUTH)
        t.join(120)
    d = _data(metrics_server, DASH_AUTH)
    assert all(r["rid"] != "dash-inflight" for r in d["inflight"]["rows"])


def test_dashboard_page_assets_and_root(metrics_server: ServerHandle) -> None:
    # The page and its assets load without the key (the page asks for it).
    r = metrics_server.get("/dashboard")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "/dashboard/static/dashboard.js" in r.text and "<canvas" in r.text
    assert "http://" not in r.text and "https://" not in r.text  # nothing from elsewhere
    for name, ctype in (("dashboard.js", "text/javascript"), ("dashboard.css", "text/css")):
        r = metrics_server.get(f"/dashboard/static/{name}")
        assert r.status_code == 200 and r.headers["content-type"].startswith(ctype)
        assert "http://" not in r.text and "https://" not in r.text
    assert "/dashboard/data" in metrics_server.get("/dashboard/static/dashboard.js").text
    assert metrics_server.get("/dashboard/static/nope.js").status_code == 404
    r = metrics_server.get("/", allow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "/dashboard"
    # Still protected: everything else.
    assert metrics_server.get("/get_server_info").status_code == 401
    # Not in the OpenAPI schema (SGLang has none of these routes).
    paths = metrics_server.get("/openapi.json", headers=DASH_AUTH).json()["paths"]
    assert not any(p == "/" or p.startswith("/dashboard") for p in paths)


def test_dashboard_without_metrics_or_key(server: ServerHandle) -> None:
    d = _data(server)
    assert d["server"]["enable_metrics"] is False
    assert d["scheduler"]["kv"]["capacity"] > 0
    deadline = time.monotonic() + 10  # logged right after /health turns 200
    while "Dashboard: http://" not in server.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert f"Dashboard: {server.base_url}/dashboard" in server.log()
    assert server.get("/").url.endswith("/dashboard")

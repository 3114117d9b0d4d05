"""/metrics: Prometheus text with SGLang's names, counting what the server really did."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest

from tests.server.conftest import ServerHandle, TinyModel, launch_server


@pytest.fixture(scope="module")
def metrics_server(tiny_model: TinyModel, server_logs) -> Iterator[ServerHandle]:
    handle = launch_server(
        tiny_model.path, "--enable-metrics", "--api-key", "k", log_dir=server_logs
    )
    yield handle
    handle.stop()


def _value(text: str, name: str) -> float:
    m = re.search(rf'^{re.escape(name)}\{{model_name="[^"]*"\}} (\S+)$', text, re.M)
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

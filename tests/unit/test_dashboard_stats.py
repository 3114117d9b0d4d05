"""DashboardStats (managers/dashboard_stats.py): windowed token counts, TTFT / ITL samples,
the in-flight table and the merge of DP replicas' internal states."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mini_sglang.managers.dashboard_stats import (
    DashboardStats,
    inflight_table,
    merge_schedulers,
    percentile,
)


def _state(created: float, **kw) -> SimpleNamespace:
    obj = SimpleNamespace(input_ids=kw.pop("input_ids", None), stream=kw.pop("stream", False))
    return SimpleNamespace(
        obj=obj, created_time=created, dash_tokens=0, dash_last_time=None, meta_info=None, **kw
    )


def _meta(done: int, prompt: int = 4, cached: int = 0) -> dict:
    return {"completion_tokens": done, "prompt_tokens": prompt, "cached_tokens": cached}


def test_percentile_interpolates() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile(list(range(101)), 99) == pytest.approx(99.0)


def test_on_output_counts_tokens_ttft_itl_and_hit_rate() -> None:
    stats = DashboardStats(window_s=60, rate_window_s=5)
    t0 = 1000.0
    st = _state(t0)
    stats.on_output(st, _meta(1), False, t0 + 0.5)  # first token: TTFT 0.5
    stats.on_output(st, _meta(3), False, t0 + 0.7)  # 2 tokens in 0.2 s: one ITL sample 0.1
    stats.on_output(st, _meta(3), False, t0 + 0.8)  # nothing new: no sample
    stats.on_output(st, _meta(4, prompt=10, cached=6), True, t0 + 0.9)
    out = stats.tokenizer_side(t0 + 1.0)
    assert out["totals"] == {
        "generation_tokens": 4,
        "prompt_tokens": 10,
        "cached_tokens": 6,
        "requests": 1,
    }
    assert out["ttft_s"]["count"] == 1 and out["ttft_s"]["p50"] == pytest.approx(0.5)
    assert out["itl_s"]["count"] == 2
    # ITL samples 0.1 and 0.2 (the 0.8 s message carried no token: no sample).
    assert out["itl_s"]["p50"] == pytest.approx(0.15)
    assert out["cache_hit_rate_window"] == pytest.approx(0.6)
    assert out["finished_requests_window"] == 1
    # 4 tokens over the 5 s rate window (whole seconds before now, and now.s fraction).
    assert out["gen_throughput"] == pytest.approx(4 / 5.0)
    # Past the window everything but the totals has aged out.
    later = stats.tokenizer_side(t0 + 200)
    assert later["generation_tokens_window"] == 0 and later["ttft_s"]["count"] == 0
    assert later["cache_hit_rate_window"] is None and later["totals"]["requests"] == 1


def test_buckets_stay_bounded_by_the_window() -> None:
    stats = DashboardStats(window_s=10)
    st = _state(0.0)
    for i in range(1, 1000):
        stats.on_output(st, _meta(i), False, float(i))
    assert len(stats._buckets) <= 12


def test_inflight_table_oldest_first() -> None:
    young = _state(9.0, input_ids=[1, 2, 3], stream=True)
    old = _state(5.0)
    old.meta_info = {"prompt_tokens": 7, "completion_tokens": 2}
    table = inflight_table({"a": young, "b": old}, now=10.0)
    assert table["count"] == 2
    assert [r["rid"] for r in table["rows"]] == ["b", "a"]
    assert table["rows"][0] == {
        "rid": "b",
        "prompt_tokens": 7,
        "output_tokens": 2,
        "age_s": 5.0,
        "stream": False,
    }
    assert table["rows"][1]["prompt_tokens"] == 3 and table["rows"][1]["output_tokens"] == 0


def test_merge_schedulers_sums_replicas_and_kv_adds_up() -> None:
    def state(running: int, free: int, evictable: int) -> dict:
        return {
            "num_running_reqs": running,
            "num_queue_reqs": 1,
            "last_gen_throughput": 10.0,
            "memory_accounting": {"capacity": 100, "free": free, "evictable": evictable},
        }

    merged = merge_schedulers([state(2, 50, 30), state(3, 90, 0)])
    assert merged["num_running_reqs"] == 5 and merged["num_queue_reqs"] == 2
    assert merged["last_gen_throughput"] == 20.0
    assert merged["kv"] == {"capacity": 200, "used": 30, "evictable": 30, "free": 140}
    assert [r["kv"]["used"] for r in merged["replicas"]] == [20, 10]

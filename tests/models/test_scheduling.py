"""RadixAttention and memory-aware scheduling through the real in-process Scheduler.

A tiny random Llama (2 layers) runs on CPU. Checked: prefix-cache hits reported as
meta_info.cached_tokens (page-aligned with --page-size), greedy outputs identical with and
without the radix cache, a tiny KV pool that forces chunked prefill and retraction while
every request still completes with the unconstrained outputs, the schedule policies,
--max-queued-requests, --max-running-requests, flush_cache, the idle memory self-check,
and ServerArgs keeping the implemented LFU eviction and pt load format.
"""

from __future__ import annotations

import logging
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from mini_sglang.managers.io_struct.control import AbortReq
from mini_sglang.managers.req import Req
from mini_sglang.managers.schedule_policy import LPM_FALLBACK_QUEUE_LEN, SchedulePolicy
from mini_sglang.mem_cache.allocator import get_allocator
from mini_sglang.mem_cache.chunk_cache import ChunkCache
from mini_sglang.mem_cache.radix_cache import RadixCache
from mini_sglang.sampling.sampling_params import SamplingParams
from mini_sglang.server_args import ServerArgs
from tests.conftest import (
    assert_memory_all_free,
    collect_outputs,
    make_req,
    make_scheduler,
    run_prompts,
)

PREFIX_LEN = 200
MAX_NEW = 12


def _rand_ids(rng: random.Random, n: int) -> list[int]:
    # Ordinary vocabulary ids (the Qwen tokenizer's first 50k are plain tokens).
    return [rng.randrange(100, 50_000) for _ in range(n)]


@pytest.fixture(scope="module")
def model_path(tiny_llama_path: str) -> str:
    """The session's tiny random Llama (seed 0), read-only."""
    return tiny_llama_path


@pytest.fixture(scope="module")
def shared_prefix_prompts() -> list[list[int]]:
    """Six prompts: one 200-token prefix, then distinct 5..30-token questions whose first
    tokens all differ (so a hit is exactly the prefix, no more)."""
    rng = random.Random(1)
    prefix = _rand_ids(rng, PREFIX_LEN)
    firsts = rng.sample(range(50_000, 60_000), 6)
    return [prefix + [f] + _rand_ids(rng, 4 + 5 * i) for i, f in enumerate(firsts)]


@pytest.fixture(scope="module")
def reference_outputs(model_path: str, shared_prefix_prompts) -> list[list[int]]:
    """Greedy outputs without any prefix sharing (--disable-radix-cache)."""
    sched = make_scheduler(model_path, disable_radix_cache=True)
    results = run_prompts(sched, shared_prefix_prompts, MAX_NEW)
    outs = [r.output_ids for r in results]
    # Guards the comparisons' power: a model repeating one token would match anything.
    assert all(len(o) == MAX_NEW and len(set(o)) >= 4 for o in outs), outs
    assert_memory_all_free(sched)
    return outs


def _cached_tokens(messages: list[Any]) -> dict[str, int]:
    """meta_info.cached_tokens of each request (its last message's value)."""
    cached: dict[str, int] = {}
    for msg in messages:
        for rid, n in zip(msg.rids, msg.cached_tokens):
            cached[rid] = n
    return cached


# ---- radix prefix cache -----------------------------------------------------------------
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no_overlap"])
def test_shared_prefix_hits_and_same_outputs(
    model_path: str, shared_prefix_prompts, reference_outputs, page_size: int, overlap: bool
) -> None:
    """The first request runs alone and fills the tree; the other five then share its
    200-token prefix: each reports cached_tokens == the prefix rounded down to whole pages,
    and every output equals the no-radix-cache run."""
    sched = make_scheduler(model_path, page_size=page_size, disable_overlap_schedule=not overlap)
    first = run_prompts(sched, shared_prefix_prompts[:1], MAX_NEW, rid_prefix="first")
    rest = run_prompts(sched, shared_prefix_prompts[1:], MAX_NEW, rid_prefix="rest")
    outs = [r.output_ids for r in first + rest]
    assert outs == reference_outputs
    cached = _cached_tokens(sched.test_outputs)
    expected = PREFIX_LEN // page_size * page_size  # 200, or 192 with 16-token pages
    assert cached["first0"] == 0
    assert [cached[f"rest{i}"] for i in range(5)] == [expected] * 5, cached
    assert_memory_all_free(sched)
    # The tree holds the shared prefix once: 200 + 6 distinct tails, not 6 copies.
    tree_tokens = sched.tree_cache.total_size()
    assert tree_tokens < PREFIX_LEN * 2, tree_tokens
    sched.tree_cache.check_invariants()


def test_rerun_same_prompt_hits_all_but_last_token(model_path: str, shared_prefix_prompts):
    """A repeated prompt matches everything but its last token (that one is recomputed for
    its logits), and gives the same output."""
    sched = make_scheduler(model_path)
    prompt = shared_prefix_prompts[2]
    a = run_prompts(sched, [prompt], MAX_NEW, rid_prefix="a")
    b = run_prompts(sched, [prompt], MAX_NEW, rid_prefix="b")
    assert a[0].output_ids == b[0].output_ids
    assert _cached_tokens(sched.test_outputs)["b0"] == len(prompt) - 1


def test_no_radix_cache_reports_no_hits(model_path: str, shared_prefix_prompts):
    sched = make_scheduler(model_path, disable_radix_cache=True)
    run_prompts(sched, shared_prefix_prompts[:1], MAX_NEW, rid_prefix="a")
    run_prompts(sched, shared_prefix_prompts[1:3], MAX_NEW, rid_prefix="b")
    assert set(_cached_tokens(sched.test_outputs).values()) == {0}
    assert sched.stats.memory_accounting()["free"] == sched.max_total_num_tokens


# ---- tiny KV pool: chunked prefill + retraction ------------------------------------------
@pytest.fixture(scope="module")
def crowd_prompts() -> list[list[int]]:
    """24 prompts of 8..40 tokens (a few sharing a prefix) plus one of 150 tokens, longer
    than the 64-token chunk."""
    rng = random.Random(7)
    shared = _rand_ids(rng, 20)
    prompts = []
    for i in range(23):
        body = _rand_ids(rng, rng.randrange(8, 40))
        prompts.append(shared + body if i % 4 == 0 else body)
    prompts.insert(11, _rand_ids(rng, 150))
    return prompts


CROWD_MAX_NEW = 24


@pytest.fixture(scope="module")
def crowd_reference(model_path: str, crowd_prompts) -> list[list[int]]:
    sched = make_scheduler(model_path, max_total_tokens=8192, chunked_prefill_size=-1)
    results = run_prompts(sched, crowd_prompts, CROWD_MAX_NEW)
    assert sched.stats.num_retracted_reqs == 0
    return [r.output_ids for r in results]


@pytest.mark.parametrize(
    "page_size, overlap", [(1, True), (4, True), (1, False)], ids=["p1", "p4", "p1_no_overlap"]
)
def test_tiny_pool_retracts_and_matches(
    model_path: str, crowd_prompts, crowd_reference, page_size: int, overlap: bool, caplog
) -> None:
    """~1,300 tokens of work in a 400-token pool with 64-token chunks: everything finishes
    with the large-pool outputs, requests were retracted (and said so in the log), and the
    idle self-check never fired."""
    sched = make_scheduler(
        model_path,
        max_total_tokens=400,
        chunked_prefill_size=64,
        page_size=page_size,
        disable_overlap_schedule=not overlap,
    )
    with caplog.at_level(logging.WARNING, logger="mini_sglang"):
        results = run_prompts(sched, crowd_prompts, CROWD_MAX_NEW)
    assert [r.output_ids for r in results] == crowd_reference
    assert all(r.finish_reason == {"type": "length", "length": CROWD_MAX_NEW} for r in results)
    assert sched.stats.num_retracted_reqs > 0
    assert any("Retract requests" in r.getMessage() for r in caplog.records)
    assert sched.stats.memory_check_failures == 0
    assert_memory_all_free(sched)
    assert sched.internal_state()["memory_check_failures"] == 0
    sched.tree_cache.check_invariants()


def test_retraction_right_after_prefill_under_overlap(model_path: str) -> None:
    """With overlap, a prefill batch joins the running batch before its results are
    processed; when that decode batch does not fit, retraction must wait for those results
    (retracting a request whose prefill result is still pending frees its slot, and
    processing that result then fails on the freed slot)."""
    rng = random.Random(5)
    shared = [rng.randrange(100, 50000) for _ in range(rng.choice([8, 40, 90]))]
    prompts = []
    for _ in range(rng.randrange(6, 20)):
        body = [rng.randrange(100, 50000) for _ in range(rng.randrange(1, 60))]
        prompts.append(shared[: rng.randrange(0, len(shared) + 1)] + body)
    ref = make_scheduler(model_path, disable_radix_cache=True, chunked_prefill_size=-1)
    expected = [r.output_ids for r in run_prompts(ref, prompts, 30)]
    sched = make_scheduler(
        model_path,
        max_total_tokens=200,
        chunked_prefill_size=32,
        page_size=16,
        schedule_policy="lof",
        max_prefill_tokens=64,
    )
    results = run_prompts(sched, prompts, 30, stagger=lambda i: 1)
    assert [r.output_ids for r in results] == expected
    assert sched.stats.num_retracted_reqs > 0
    assert_memory_all_free(sched)


def test_idle_self_check_reports_a_leak(model_path: str, caplog) -> None:
    """The self-check is not vacuous: a slot taken behind the scheduler's back is reported
    as an error with the numbers, and counted in internal_state."""
    sched = make_scheduler(model_path, max_total_tokens=256)
    assert sched.stats.check_memory()
    leaked = sched.allocator.alloc(3)
    with caplog.at_level(logging.ERROR, logger="mini_sglang"):
        assert not sched.stats.check_memory()
    assert sched.internal_state()["memory_check_failures"] == 1
    msg = next(r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
    assert "free=253" in msg and "capacity=256" in msg, msg
    sched.allocator.free(leaked)
    assert sched.stats.check_memory()


def test_abort_logs_sglang_debug_lines(model_path: str, caplog) -> None:
    """At debug level an abort logs SGLang's lines: "Abort running request. req.rid='a'"
    for one in the running batch, "Abort queued request. req.rid='b'" for one waiting."""
    sched = make_scheduler(model_path, max_running_requests=1)
    sched.add_request(make_req("a", [1000, 2000, 3000], 16, ignore_eos=True))
    sched.add_request(make_req("b", [1001, 2000, 3000], 16, ignore_eos=True))
    sched.run_step()
    sched.run_step()
    with caplog.at_level(logging.DEBUG, logger="mini_sglang"):
        sched.abort_request(AbortReq(rid="a"))
        sched.abort_request(AbortReq(rid="b"))
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert "Abort running request. req.rid='a'" in lines, lines
    assert "Abort queued request. req.rid='b'" in lines, lines
    sched.run_until_idle()
    outs = collect_outputs(sched.test_outputs)
    assert outs["a"].finish_reason["type"] == outs["b"].finish_reason["type"] == "abort"
    assert_memory_all_free(sched)


# ---- limits ---------------------------------------------------------------------------------
def test_max_queued_requests_refuses_at_once(model_path: str) -> None:
    sched = make_scheduler(model_path, max_queued_requests=2)
    prompts = [[1000 + i, 2000, 3000] for i in range(3)]
    for i, ids in enumerate(prompts):
        sched.add_request(make_req(f"q{i}", ids, 4, ignore_eos=True))
    # The third was answered right away (no step has run) and nothing of it is queued.
    assert [r.rid for r in sched.waiting_queue] == ["q0", "q1"]
    refused = collect_outputs(sched.test_outputs)
    assert list(refused) == ["q2"]
    reason = refused["q2"].finish_reason
    assert reason["type"] == "abort" and reason["status_code"] == 503  # SGLang's retryable
    assert reason["message"] == "The request queue is full."
    sched.run_until_idle()
    done = collect_outputs(sched.test_outputs)
    assert [len(done[f"q{i}"].output_ids) for i in range(2)] == [4, 4]
    # Once the queue drained, new requests are accepted again.
    run_prompts(sched, prompts[:2], 2, rid_prefix="again")
    assert_memory_all_free(sched)


def test_max_running_requests_caps_the_batch(model_path: str) -> None:
    sched = make_scheduler(model_path, max_running_requests=3)
    assert sched.max_running_requests == 3
    rng = random.Random(3)
    prompts = [_rand_ids(rng, 10) for _ in range(8)]
    for i, ids in enumerate(prompts):
        sched.add_request(make_req(f"m{i}", ids, 6, ignore_eos=True))
    sizes = []
    while sched.run_step() or sched.has_work():
        batch = sched.cur_batch
        if batch is not None:
            running = len(sched.running_batch.reqs) if sched.running_batch else 0
            sizes.append(len(batch.reqs))
            assert len(batch.reqs) <= 3 and running <= 3
    assert max(sizes) == 3
    assert len(collect_outputs(sched.test_outputs)) == 8
    assert_memory_all_free(sched)


def test_max_prefill_tokens_splits_prefill_batches(model_path: str) -> None:
    """--max-prefill-tokens 64: 20-token prompts go at most 3 per prefill batch (the
    budget check is `>=`, SGLang's), while one longer prompt alone is still admitted."""
    sched = make_scheduler(model_path, max_prefill_tokens=64, chunked_prefill_size=-1)
    rng = random.Random(4)
    for i in range(7):
        sched.add_request(make_req(f"p{i}", _rand_ids(rng, 20), 2, ignore_eos=True))
    sched.add_request(make_req("long", _rand_ids(rng, 100), 2, ignore_eos=True))
    prefill_sizes = []
    while sched.run_step() or sched.has_work():
        b = sched.cur_batch
        if b is not None and b.forward_mode.is_extend():
            prefill_sizes.append([r.rid for r in b.reqs])
    assert [len(s) for s in prefill_sizes] == [3, 3, 1, 1], prefill_sizes
    assert prefill_sizes[-1] == ["long"]
    assert_memory_all_free(sched)


def test_chunked_prefill_one_request_at_a_time(model_path: str) -> None:
    """Two 100-token prompts with 32-token chunks: never more than one chunked request, and
    each prefill batch extends at most 32 tokens."""
    sched = make_scheduler(model_path, chunked_prefill_size=32)
    rng = random.Random(5)
    prompts = [_rand_ids(rng, 100), _rand_ids(rng, 100)]
    for i, ids in enumerate(prompts):
        sched.add_request(make_req(f"c{i}", ids, 3, ignore_eos=True))
    extends = []
    while sched.run_step() or sched.has_work():
        b = sched.cur_batch
        if b is not None and b.forward_mode.is_extend():
            extends.append(sum(b.extend_lens))
            assert sum(1 for r in b.reqs if r.is_chunked) <= 1
    assert max(extends) <= 32 and sum(extends) == 200, extends
    assert_memory_all_free(sched)


def test_input_embeds_chunked_and_mixed_with_ids(model_path: str) -> None:
    """A prompt given as its own embedding-table rows gives its ids' greedy output, also
    when 8-token chunks split it and when it shares batches with id prompts; its stand-in
    ids (1s) never reach the model at prompt positions."""
    rng = random.Random(11)
    prompts = [_rand_ids(rng, 20), _rand_ids(rng, 13)]
    ref = make_scheduler(model_path, disable_radix_cache=True)
    expected = [r.output_ids for r in run_prompts(ref, prompts, 6)]
    sched = make_scheduler(model_path, disable_radix_cache=True, chunked_prefill_size=8)
    table = sched.tp_worker.model_runner.model.model.embed_tokens.weight.detach().float()
    for i, ids in enumerate(prompts):
        embeds = table[torch.tensor(ids)].clone()
        sched.add_request(make_req(f"e{i}", [1] * len(ids), 6, True, input_embeds=embeds))
        sched.add_request(make_req(f"i{i}", ids, 6, ignore_eos=True))
    sched.run_until_idle()
    outs = collect_outputs(sched.test_outputs)
    for i in range(2):
        assert outs[f"e{i}"].output_ids == expected[i] == outs[f"i{i}"].output_ids
    assert_memory_all_free(sched)


# ---- flush_cache ----------------------------------------------------------------------------
def test_flush_cache_when_idle_and_refused_when_busy(model_path: str, shared_prefix_prompts):
    sched = make_scheduler(model_path)
    run_prompts(sched, shared_prefix_prompts[:2], 4)
    assert sched.tree_cache.evictable_size() > 0
    sched.add_request(make_req("busy", shared_prefix_prompts[3], 4, ignore_eos=True))
    assert not sched.flush_cache()  # queued
    sched.run_step()  # its prefill is launched (in flight with overlap)
    assert not sched.flush_cache()
    sched.run_until_idle()
    assert sched.flush_cache()
    m = sched.stats.memory_accounting()
    assert m["evictable"] == 0 and m["free"] == m["capacity"], m
    assert sched.tree_cache.total_size() == 0
    # The scheduler works normally afterwards, without hits.
    before = len(sched.test_outputs)
    run_prompts(sched, shared_prefix_prompts[:1], 4, rid_prefix="after")
    assert _cached_tokens(sched.test_outputs[before:])["after0"] == 0
    assert_memory_all_free(sched)


# ---- schedule policies (real RadixCache, no model) ----------------------------------------
def _req(rid: str, ids: list[int], max_new: int = 8) -> Req:
    sp = SamplingParams(max_new_tokens=max_new, temperature=0.0)
    sp.normalize(None)
    return Req(rid, "", ids, sp)


def _tree(seqs: list[list[int]]) -> RadixCache:
    alloc = get_allocator(4096, 1)
    cache = RadixCache(None, alloc, page_size=1)
    for s in seqs:
        cache.insert(s, alloc.alloc(len(s)))
    return cache


def test_lpm_orders_by_cached_prefix() -> None:
    cache = _tree([list(range(1, 41)), list(range(100, 110))])
    queue = [
        _req("none", [7, 7, 7, 7]),
        _req("short", list(range(100, 110)) + [5]),
        _req("long", list(range(1, 41)) + [5]),
        _req("mid", list(range(1, 21)) + [9, 9]),
    ]
    assert SchedulePolicy("lpm", cache).calc_priority(queue)
    assert [r.rid for r in queue] == ["long", "mid", "short", "none"]
    assert [len(r.prefix_indices) for r in queue] == [40, 20, 10, 0]


def test_lpm_falls_back_to_fcfs_beyond_128_queued() -> None:
    cache = _tree([list(range(1, 41))])
    n = LPM_FALLBACK_QUEUE_LEN + 1
    queue = [_req(f"r{i}", [5000 + i] if i < n - 1 else list(range(1, 41))) for i in range(n)]
    policy = SchedulePolicy("lpm", cache)
    assert not policy.calc_priority(queue)
    assert [r.rid for r in queue] == [f"r{i}" for i in range(n)]
    # At exactly 128 queued it still sorts by prefix.
    queue = queue[1:]
    assert policy.calc_priority(queue)
    assert queue[0].rid == f"r{n - 1}"


@pytest.mark.parametrize("policy", ["lpm", "dfs-weight"])
def test_cache_aware_policies_fall_back_without_radix_cache(policy: str) -> None:
    cache = ChunkCache(None, get_allocator(64, 1))
    p = SchedulePolicy(policy, cache)
    assert p.policy == "fcfs"
    queue = [_req("a", [1, 2]), _req("b", list(range(30)))]
    assert not p.calc_priority(queue)
    assert [r.rid for r in queue] == ["a", "b"]


def test_lof_orders_by_max_new_tokens() -> None:
    queue = [_req("a", [1], 4), _req("b", [2], 64), _req("c", [3], 16), _req("d", [4], 64)]
    SchedulePolicy("lof", _tree([])).calc_priority(queue)
    # Longest output first; the sort is stable, so b stays before d.
    assert [r.rid for r in queue] == ["b", "d", "c", "a"]


def test_dfs_weight_groups_by_subtree() -> None:
    """Two cached subtrees A (prefix 1..30) and B (prefix 200..230). Three waiting requests
    fall under B, one under A, and they arrive interleaved: dfs-weight serves the heavier
    subtree B first and keeps each subtree's requests together."""
    a, b = list(range(1, 31)), list(range(200, 231))
    cache = _tree([a + [40, 41], a + [50, 51], b + [60, 61], b + [70, 71]])
    queue = [
        _req("b1", b + [60, 61, 1]),
        _req("a1", a + [40, 41, 9]),
        _req("b2", b + [70, 71, 2]),
        _req("x", [999, 998]),
        _req("b3", b + [70, 71, 3]),
    ]
    SchedulePolicy("dfs-weight", cache).calc_priority(queue)
    order = [r.rid for r in queue]
    assert order[0] == "x"  # waits on the root itself, visited first
    assert order[1:] in (["b2", "b3", "b1", "a1"], ["b1", "b2", "b3", "a1"]), order
    # Within B, the [70, 71] branch (two requests) comes before [60, 61] (one).
    assert order.index("b2") < order.index("b1") and order.index("b3") < order.index("b1")


def test_random_policy_permutes() -> None:
    queue = [_req(f"r{i}", [i + 1]) for i in range(30)]
    random.seed(0)
    SchedulePolicy("random", _tree([])).calc_priority(queue)
    rids = [r.rid for r in queue]
    assert sorted(rids) == sorted(f"r{i}" for i in range(30)) and rids != sorted(rids)


def test_lpm_admits_the_cached_request_first(model_path: str) -> None:
    """End to end: with room for one prompt per prefill batch, lpm admits the request
    whose prefix is cached before an earlier-queued one; fcfs keeps arrival order."""
    rng = random.Random(11)
    warm = _rand_ids(rng, 60)
    cold = _rand_ids(rng, 60)
    for policy, first in (("lpm", "hit"), ("fcfs", "miss")):
        sched = make_scheduler(
            model_path,
            schedule_policy=policy,
            max_prefill_tokens=40,
            disable_overlap_schedule=True,
        )
        run_prompts(sched, [warm], 2, rid_prefix="warm")
        sched.add_request(make_req("miss", cold, 2, ignore_eos=True))
        sched.add_request(make_req("hit", warm[:50] + [7, 8], 2, ignore_eos=True))
        assert sched.step()
        assert [r.rid for r in sched.cur_batch.reqs] == [first], policy
        sched.run_until_idle()
        assert_memory_all_free(sched)


# ---- ServerArgs: implemented features are not "unsupported" -------------------------------
def test_lfu_eviction_and_pt_load_format_are_kept(caplog) -> None:
    with caplog.at_level(logging.WARNING):
        args = ServerArgs(model_path="m", radix_eviction_policy="lfu", load_format="pt")
    assert (args.radix_eviction_policy, args.load_format) == ("lfu", "pt")
    assert not [r for r in caplog.records if "not supported" in r.getMessage()]


def test_lfu_scheduler_uses_lfu_tree(model_path: str, shared_prefix_prompts) -> None:
    sched = make_scheduler(model_path, radix_eviction_policy="lfu", max_total_tokens=512)
    assert sched.tree_cache.eviction_policy == "lfu"
    results = run_prompts(sched, shared_prefix_prompts[:3], 4)
    assert [len(r.output_ids) for r in results] == [4, 4, 4]
    assert_memory_all_free(sched)


def test_new_token_ratio_env_names(model_path: str) -> None:
    """SGLang's env var names set the memory budget's new_token_ratio schedule (read at
    import, so in a fresh interpreter)."""
    code = (
        "from conftest import make_scheduler\n"
        f"s = make_scheduler({model_path!r}, schedule_conservativeness=0.5)\n"
        "import mini_sglang.managers.schedule_policy as p\n"
        "import mini_sglang.managers.scheduler_retraction as r\n"
        "rt = s.retraction\n"
        "print(rt.init_new_token_ratio, rt.min_new_token_ratio, rt.new_token_ratio_decay,"
        " p.CLIP_MAX_NEW_TOKENS, r.RETRACT_DECODE_STEPS)\n"
    )
    env = {
        **os.environ,
        "SGLANG_INIT_NEW_TOKEN_RATIO": "0.8",
        "SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR": "0.25",
        "SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS": "10",
        "SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION": "123",
        "SGLANG_RETRACT_DECODE_STEPS": "7",
    }
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=str(Path(__file__).resolve().parents[1]),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    init, low, decay, clip, steps = map(float, out.stdout.split()[-5:])
    # 0.8 x conservativeness 0.5; the floor is 0.25 of that; decay spreads over 10 steps.
    assert (init, low, clip, steps) == pytest.approx((0.4, 0.1, 123, 7))
    assert decay == pytest.approx((0.4 - 0.1) / 10)

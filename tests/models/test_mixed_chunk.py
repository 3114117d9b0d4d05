"""--enable-mixed-chunk through the real in-process Scheduler (tiny random Llama, float32,
CPU, torch_native attention).

Prompts arrive staggered while others decode, and a small --chunked-prefill-size splits
the long ones into several chunks, so prefill batches form while requests are running and
the running batch rides along in MIXED forwards. Checked against the same scheduler without
the flag: identical greedy tokens (radix on/off, page size 1/4, overlap on/off), identical
finish reasons with varied max_new_tokens and stop tokens, streaming deltas that add up,
logprobs (prompt and output) of requests that were mixed, every KV slot free when idle,
and that mixing really happened (so an ignored flag fails the tests).
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.conftest import (
    assert_memory_all_free,
    collect_outputs,
    make_req,
    make_scheduler,
    run_prompts,
)

CHUNK = 16
MAX_NEW = 10


def _prompts(seed: int = 3) -> list[list[int]]:
    """Seven prompts of 5..70 tokens (most longer than a chunk); the last two share a
    40-token prefix with the first, so the radix cache has something to match."""
    rng = random.Random(seed)
    ids = [[rng.randrange(100, 50_000) for _ in range(n)] for n in (70, 9, 45, 5, 33)]
    shared = ids[0][:40]
    ids += [shared + [rng.randrange(100, 50_000) for _ in range(n)] for n in (12, 3)]
    return ids


def _stagger(i: int) -> int:
    return 0 if i == 0 else 2 + i % 3


@pytest.fixture(scope="module")
def model_path(tiny_llama_path: str) -> str:
    """The session's tiny random Llama (seed 0), read-only."""
    return tiny_llama_path


def _sched(model_path: str, mixed: bool, **kw: Any):
    kw.setdefault("chunked_prefill_size", CHUNK)
    return make_scheduler(model_path, enable_mixed_chunk=mixed, **kw)


@pytest.fixture(scope="module")
def reference(model_path: str) -> list[list[int]]:
    sched = _sched(model_path, False, disable_radix_cache=True, disable_overlap_schedule=True)
    outs = [r.output_ids for r in run_prompts(sched, _prompts(), MAX_NEW, stagger=_stagger)]
    assert all(len(o) == MAX_NEW and len(set(o)) >= 4 for o in outs), outs
    assert sched.stats.num_mixed_batches == 0
    assert_memory_all_free(sched)
    return outs


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("radix", [True, False], ids=["radix", "no-radix"])
def test_mixed_greedy_matches_unmixed(
    model_path: str, reference, radix: bool, page_size: int, overlap: bool
) -> None:
    sched = _sched(
        model_path,
        True,
        disable_radix_cache=not radix,
        page_size=page_size,
        disable_overlap_schedule=not overlap,
    )
    results = run_prompts(sched, _prompts(), MAX_NEW, stagger=_stagger)
    assert [r.output_ids for r in results] == reference
    assert all(r.finish_reason["type"] == "length" for r in results)
    assert sched.stats.num_mixed_batches > 0 and sched.stats.num_mixed_decode_rows > 0
    assert_memory_all_free(sched)


def test_flag_off_or_no_chunking_never_mixes(model_path: str) -> None:
    """SGLang mixes only with chunked prefill on (--chunked-prefill-size > 0)."""
    sched = _sched(model_path, True, chunked_prefill_size=-1)
    assert not sched.prefill.is_mixed_chunk
    run_prompts(sched, _prompts()[:3], 4, stagger=_stagger)
    assert sched.stats.num_mixed_batches == 0
    assert_memory_all_free(sched)


def _run_varied(sched, prompts, stop_ids: dict[int, int]) -> dict[str, Any]:
    """Staggered streaming requests with per-request max_new_tokens (1..12) and, for some,
    a stop token; returns collect_outputs' results by rid."""
    start = len(sched.test_outputs)
    for i, ids in enumerate(prompts):
        for _ in range(_stagger(i)):
            sched.run_step()
        req = make_req(f"v{i}", ids, 1 + (5 * i) % 12, False, stream=True)
        if i in stop_ids:
            req.sampling_params.stop_token_ids = {stop_ids[i]}
        sched.add_request(req)
    sched.run_until_idle()
    return collect_outputs(sched.test_outputs[start:])


@pytest.mark.parametrize("page_size", [1, 4])
def test_finish_and_streaming_in_mixed_batches(model_path: str, reference, page_size: int) -> None:
    """Requests finish (length or stop token) while their decode rows are mixed; streaming
    sends one delta per token, and the deltas add up to the unmixed outputs."""
    prompts = _prompts()
    # Stop on the 3rd token of the unmixed output for requests 2 and 4 (stop_token_ids
    # count only without ignore_eos, so these requests honour EOS too).
    stop_ids = {2: reference[2][2], 4: reference[4][2]}
    runs = []
    for mixed in (False, True):
        sched = _sched(model_path, mixed, page_size=page_size)
        res = _run_varied(sched, prompts, stop_ids)
        assert_memory_all_free(sched)
        runs.append((sched, res))
    (_, plain), (mixed_sched, mixed) = runs
    assert mixed_sched.stats.num_mixed_batches > 0
    assert set(plain) == set(mixed) == {f"v{i}" for i in range(len(prompts))}
    for rid in plain:
        assert mixed[rid].output_ids == plain[rid].output_ids, rid
        assert mixed[rid].finish_reason == plain[rid].finish_reason, rid
    assert mixed["v2"].finish_reason["type"] == "stop"
    # Streaming: one message per token for every request (stream_interval 1).
    per_rid: dict[str, int] = {}
    for msg in mixed_sched.test_outputs:
        for rid, ids in zip(msg.rids, msg.output_ids):
            per_rid[rid] = per_rid.get(rid, 0) + 1
            assert len(ids) <= 1, (rid, ids)
    assert all(per_rid[rid] >= len(mixed[rid].output_ids) for rid in mixed)


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
def test_logprobs_of_mixed_requests(model_path: str, overlap: bool) -> None:
    """Prompt and output logprobs are the same whether the requests were decoded in mixed
    forwards or plain decode steps (SGLang 0.5.4 never mixes logprob requests; here they
    are mixed, and this is what keeps that honest)."""
    prompts = _prompts()[:5]
    runs = []
    for mixed in (False, True):
        sched = _sched(model_path, mixed, disable_overlap_schedule=not overlap)
        res = run_prompts(
            sched,
            prompts,
            6,
            stagger=_stagger,
            return_logprob=True,
            logprob_start_len=3,
            top_logprobs_num=2,
        )
        assert_memory_all_free(sched)
        runs.append((sched, res))
    (_, plain), (mixed_sched, mixed) = runs
    assert mixed_sched.stats.num_mixed_batches > 0 and mixed_sched.stats.num_mixed_decode_rows > 0
    for p, m, ids in zip(plain, mixed, prompts):
        assert m.output_ids == p.output_ids
        assert len(m.output_logprobs) == len(p.output_logprobs) == 6
        assert m.output_logprobs == pytest.approx(p.output_logprobs, abs=1e-4)
        # Positions logprob_start_len.. of the prompt: a None, then one value each.
        assert len(m.input_logprobs) == len(p.input_logprobs) == len(ids) - 3
        assert m.input_logprobs[0] is None and p.input_logprobs[0] is None
        assert m.input_logprobs[1:] == pytest.approx(p.input_logprobs[1:], abs=1e-4)


def test_prefill_adder_reserves_the_decode_tokens() -> None:
    """SGLang's accounting: the mixed decode tokens come off the prefill and chunk budgets
    and are held back from memory, so a 40-token prompt with 3 decodes mixed in gets a
    13-token chunk of a 16-token chunk budget (12 with 4-token pages)."""
    from mini_sglang.managers.req import Req
    from mini_sglang.managers.schedule_policy import PrefillAdder
    from mini_sglang.mem_cache.allocator import get_allocator
    from mini_sglang.mem_cache.chunk_cache import ChunkCache
    from mini_sglang.mem_cache.memory_pool import ReqToTokenPool
    from mini_sglang.sampling.sampling_params import SamplingParams

    for page_size, want in ((1, 13), (4, 12)):
        alloc = get_allocator(256, page_size)
        cache = ChunkCache(ReqToTokenPool(4, 64, "cpu"), alloc, page_size)
        sp = SamplingParams(max_new_tokens=4)
        sp.normalize(None)
        req = Req("a", "", list(range(100, 140)), sp)
        req.init_next_round_input(cache)
        adder = PrefillAdder(page_size, cache, alloc, None, 0.7, 100, CHUNK, 3)
        assert adder.rem_input_tokens == 97 and adder.cur_rem_tokens == alloc.available_size() - 3
        adder.add_one_req(req)
        assert adder.new_chunked_req is req and req.extend_input_len == want


def test_chunked_prompt_logprobs_same_under_overlap(model_path: str) -> None:
    """Each step's prompt-logprob offsets are frozen in its snapshot: under overlap the
    results are processed after the next chunk was scheduled, so offsets read from the
    request then would be the next chunk's (a 45-token prompt in 16-token chunks with
    logprob_start_len 3 would lose three values and misplace the rest)."""
    prompt = _prompts()[2]
    got = []
    for overlap in (False, True):
        sched = _sched(model_path, False, disable_overlap_schedule=not overlap)
        res = run_prompts(sched, [prompt], 3, return_logprob=True, logprob_start_len=3)[0]
        got.append(res.input_logprobs)
    assert len(got[0]) == len(got[1]) == len(prompt) - 3
    assert got[0][0] is None and got[1][0] is None
    assert got[1][1:] == pytest.approx(got[0][1:], abs=1e-5)

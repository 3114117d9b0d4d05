"""Custom logit processors through the in-process Scheduler under memory pressure: a tiny KV
pool with chunked prefill forces retraction (and, with --enable-mixed-chunk, mixed batches)
while requests with a stateful processor, a ban processor and none join at different steps.

Each stateful row must still produce exactly its forced sequence (its "__req__" output_ids are
right after filtering, merging, retraction and re-prefill), and rows without a processor the
tokens they get in a large pool without any processor.
"""

from __future__ import annotations

import random

import pytest

from mini_sglang.managers.io_struct.generate import TokenizedGenerateReqInput
from mini_sglang.sampling.custom_logit_processor import (
    CustomLogitProcessor,
    DisallowedTokensLogitsProcessor,
)
from mini_sglang.sampling.sampling_params import SamplingParams
from tests.conftest import assert_memory_all_free, collect_outputs, make_scheduler

MAX_NEW = 24


class ForceByCount(CustomLogitProcessor):
    """Forces custom_params["tokens"][number of output ids so far]."""

    def __call__(self, logits, custom_param_list=None):
        for i, params in enumerate(custom_param_list):
            tokens = params["tokens"]
            logits[i, :] = -float("inf")
            logits[i, tokens[len(params["__req__"].output_ids) % len(tokens)]] = 0.0
        return logits


@pytest.fixture(scope="module")
def model_path(tiny_llama_path: str) -> str:
    """The session's tiny random Llama (seed 0), read-only."""
    return tiny_llama_path


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    rng = random.Random(11)
    return [[rng.randrange(100, 50_000) for _ in range(rng.randrange(8, 40))] for _ in range(18)]


def request(i: int, ids: list[int]) -> TokenizedGenerateReqInput:
    """Every third request forces tokens, every third bans two ids, the rest are plain."""
    proc, params = None, None
    if i % 3 == 0:
        proc, params = ForceByCount.to_str(), {"tokens": [1000 + i, 2000 + i, 3000 + i]}
    elif i % 3 == 1:
        proc, params = DisallowedTokensLogitsProcessor.to_str(), {"token_ids": [7, 8]}
    sp = SamplingParams(
        max_new_tokens=MAX_NEW, temperature=0.0, ignore_eos=True, custom_params=params
    )
    sp.normalize(None)
    return TokenizedGenerateReqInput(
        rid=f"r{i}", input_text="", input_ids=ids, sampling_params=sp, custom_logit_processor=proc
    )


def run(sched, prompts: list[list[int]]) -> dict[str, list[int]]:
    """Half the requests at once, the rest one every two steps (joining running batches)."""
    start = len(sched.test_outputs)
    half = len(prompts) // 2
    for i in range(half):
        sched.add_request(request(i, prompts[i]))
    for i in range(half, len(prompts)):
        for _ in range(2):
            sched.run_step()
        sched.add_request(request(i, prompts[i]))
    sched.run_until_idle()
    results = collect_outputs(sched.test_outputs[start:])
    assert all(r.finish_reason == {"type": "length", "length": MAX_NEW} for r in results.values())
    return {rid: r.output_ids for rid, r in results.items()}


@pytest.fixture(scope="module")
def reference(model_path: str, prompts) -> dict[str, list[int]]:
    sched = make_scheduler(
        model_path,
        max_total_tokens=8192,
        chunked_prefill_size=-1,
        enable_custom_logit_processor=True,
    )
    out = run(sched, prompts)
    assert sched.stats.num_retracted_reqs == 0
    return out


@pytest.mark.parametrize("mixed", [False, True], ids=["plain", "mixed_chunk"])
def test_processors_survive_retraction(model_path: str, prompts, reference, mixed: bool):
    """Without mixed chunks the tiny pool retracts; with them, decode rows (processor rows
    among them) ride in prefill batches."""
    sched = make_scheduler(
        model_path,
        max_total_tokens=400,
        chunked_prefill_size=64,
        enable_mixed_chunk=mixed,
        enable_custom_logit_processor=True,
    )
    out = run(sched, prompts)
    if mixed:
        assert sched.stats.num_mixed_batches > 0
    else:
        assert sched.stats.num_retracted_reqs > 0
    for i in range(len(prompts)):
        rid = f"r{i}"
        if i % 3 == 0:
            assert out[rid] == ([1000 + i, 2000 + i, 3000 + i] * MAX_NEW)[:MAX_NEW], rid
        elif i % 3 == 1:
            assert not {7, 8} & set(out[rid]), rid
    assert out == reference
    assert_memory_all_free(sched)

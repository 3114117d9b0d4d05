"""Randomized scheduler stress on CPU: many short requests with random lengths, sampling,
prompt logprobs, structured-output constraints (valid and invalid) and aborts, under random
combinations of pool size (small pools force retraction), chunked prefill, mixed chunks,
overlap, page size and radix cache. Every seed must finish without an error, every
regex-constrained request that stopped must match its regex, and afterwards every KV slot
and request slot must be free (the idle check). 60 seeds passed when this was written; the
suite runs a few.
"""

from __future__ import annotations

import json
import random
import re

import pytest

from mini_sglang.managers.io_struct.control import AbortReq
from tests.conftest import (
    GRAMMAR_EBNF,
    GRAMMAR_REGEX,
    PERSON_SCHEMA,
    assert_memory_all_free,
    collect_outputs,
    make_req,
    make_scheduler,
)

STEPS = 300


def _server_kwargs(rng: random.Random) -> dict:
    return dict(
        max_total_tokens=rng.choice([300, 600, 2000]),
        chunked_prefill_size=rng.choice([16, 64, -1]),
        enable_mixed_chunk=rng.random() < 0.6,
        disable_overlap_schedule=rng.random() < 0.3,
        page_size=rng.choice([1, 4]),
        disable_radix_cache=rng.random() < 0.3,
        constrained_json_disable_any_whitespace=True,
    )


def _random_req(rng: random.Random, rid: str):
    ids = [rng.randrange(100, 50_000) for _ in range(rng.randrange(1, 120))]
    extra: dict = {}
    if rng.random() < 0.3:
        extra = dict(
            return_logprob=True,
            logprob_start_len=rng.choice([0, -1, 3]),
            top_logprobs_num=rng.choice([0, 2]),
        )
    req = make_req(rid, ids, rng.randrange(1, 40), ignore_eos=rng.random() < 0.5, **extra)
    sp = req.sampling_params
    kind = rng.random()
    if kind < 0.15:
        sp.regex = GRAMMAR_REGEX
    elif kind < 0.25:
        sp.json_schema = json.dumps(PERSON_SCHEMA)
    elif kind < 0.3:
        sp.ebnf = GRAMMAR_EBNF
    elif kind < 0.33:
        sp.regex = "(ab"  # invalid: finishes with a 400 before taking KV
    if rng.random() < 0.3:
        sp.temperature = 0.8
    return req


@pytest.mark.parametrize("seed", [0, 7, 17, 54])
def test_random_workload_finishes_and_frees_everything(tiny_llama_path, seed):
    rng = random.Random(seed)
    sched = make_scheduler(tiny_llama_path, **_server_kwargs(rng))
    regex_rids, n = set(), 0
    for _ in range(STEPS):
        if rng.random() < 0.3 and n < 40:
            req = _random_req(rng, f"r{n}")
            if req.sampling_params.regex == GRAMMAR_REGEX:
                regex_rids.add(req.rid)
            sched.add_request(req)
            n += 1
        if rng.random() < 0.05 and n:
            sched.abort_request(AbortReq(rid=f"r{rng.randrange(n)}"))
        sched.run_step()
    sched.run_until_idle()
    outs = collect_outputs(sched.test_outputs)
    assert set(outs) == {f"r{i}" for i in range(n)}  # every request got a final answer
    for rid in regex_rids:
        out = outs[rid]
        if out.finish_reason and out.finish_reason["type"] == "stop":
            text = sched.tokenizer.decode(out.output_ids)
            assert re.fullmatch(GRAMMAR_REGEX, text.removesuffix("<|im_end|>")), text
    assert_memory_all_free(sched)

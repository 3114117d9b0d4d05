"""Structured outputs (json_schema / regex / ebnf) through the in-process Scheduler.

A tiny random Llama's unconstrained output is garbage, so any output that satisfies the
constraint is the grammar mask at work. Checked with and without overlap scheduling:
constrained outputs match, non-grammar requests batched with them keep their greedy tokens,
sampling and logprobs work under the mask, chunked prefill and retraction keep the matcher in
step, invalid constraints and --grammar-backend none finish with a 400 and hold no memory,
and aborts reach requests still waiting for their grammar. The constraint tests run once per
grammar backend (xgrammar in every scheduling mode, llguidance and outlines with overlap);
outlines has no ebnf and ignores the schema's integer bounds.
"""

from __future__ import annotations

import json
import math
import random
import re

import pytest

from mini_sglang.managers.io_struct.control import AbortReq
from tests.conftest import (
    GRAMMAR_EBNF,
    GRAMMAR_EBNF_RE,
    GRAMMAR_REGEX,
    PERSON_SCHEMA,
    assert_memory_all_free,
    check_person_json,
    collect_outputs,
    make_req,
    make_scheduler,
)

EOS_TEXT = "<|im_end|>"


@pytest.fixture(scope="module")
def model_path(tiny_llama_path: str) -> str:
    return tiny_llama_path


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    rng = random.Random(3)
    return [[rng.randrange(100, 50_000) for _ in range(rng.randrange(5, 30))] for _ in range(4)]


_CONSTRAINTS = ("regex", "json_schema", "ebnf")
BACKENDS = ["xgrammar", "llguidance", "outlines"]


def _req(rid: str, ids, max_new: int = 48, **kw):
    """A greedy request; json_schema / regex / ebnf go to its sampling params, any other
    keyword to the TokenizedGenerateReqInput."""
    constraint = {k: kw.pop(k) for k in _CONSTRAINTS if k in kw}
    r = make_req(rid, ids, max_new, ignore_eos=False, **kw)
    for key, value in constraint.items():
        setattr(r.sampling_params, key, value)
    return r


def _run(sched, reqs) -> dict:
    start = len(sched.test_outputs)
    for r in reqs:
        sched.add_request(r)
    sched.run_until_idle()
    return collect_outputs(sched.test_outputs[start:])


def _text(tok, ids: list[int]) -> str:
    text = tok.decode(ids)
    assert text.endswith(EOS_TEXT), text  # the grammar ended it with the model's EOS
    return text[: -len(EOS_TEXT)]


def _assert_constraints_hold(tok, out: dict, i: int, backend: str) -> None:
    """Prompt i's regex (re{i}), ebnf (eb{i}) and json_schema (js{i}) outputs obey them."""
    assert re.fullmatch(GRAMMAR_REGEX, _text(tok, out[f"re{i}"].output_ids))
    if backend != "outlines":
        assert re.fullmatch(GRAMMAR_EBNF_RE, _text(tok, out[f"eb{i}"].output_ids))
    check_person_json(_text(tok, out[f"js{i}"].output_ids), bounds=backend != "outlines")


def _person_schema(backend: str) -> dict:
    """PERSON_SCHEMA; llguidance follows JSON Schema and allows unlisted properties unless
    additionalProperties is false (xgrammar and outlines never allow them)."""
    if backend == "llguidance":
        return {**PERSON_SCHEMA, "additionalProperties": False}
    return PERSON_SCHEMA


@pytest.mark.parametrize(
    "backend, overlap, mixed",
    [
        ("xgrammar", True, False),
        ("xgrammar", False, False),
        ("xgrammar", True, True),
        ("llguidance", True, False),
        ("outlines", True, False),
    ],
    ids=["overlap", "no_overlap", "mixed_chunk", "llguidance", "outlines"],
)
def test_constraints_hold_and_plain_requests_keep_their_tokens(
    model_path, prompts, backend, overlap, mixed
):
    """Every constraint kind next to plain requests; with mixed chunked prefill the
    prompts are chunked and their chunks share forwards with grammar rows decoding."""
    chunk = {"chunked_prefill_size": 16, "enable_mixed_chunk": True} if mixed else {}
    sched = make_scheduler(
        model_path,
        grammar_backend=backend,
        disable_overlap_schedule=not overlap,
        constrained_json_disable_any_whitespace=True,
        **chunk,
    )
    tok = sched.tokenizer
    alone = _run(sched, [_req(f"p{i}", p, 12) for i, p in enumerate(prompts)])
    reqs = []
    for i, p in enumerate(prompts):
        reqs += [
            _req(f"re{i}", p, regex=GRAMMAR_REGEX),
            _req(f"js{i}", p, json_schema=json.dumps(_person_schema(backend))),
            _req(f"p{i}", p, 12),
        ]
        if backend != "outlines":  # outlines has no ebnf
            reqs.append(_req(f"eb{i}", p, ebnf=GRAMMAR_EBNF))
    out = _run(sched, reqs)
    for i in range(len(prompts)):
        _assert_constraints_hold(tok, out, i, backend)
        assert out[f"re{i}"].finish_reason["type"] == "stop"
        # Same greedy tokens as when they ran without grammar requests in the batch.
        assert out[f"p{i}"].output_ids == alone[f"p{i}"].output_ids
    assert sched.stats.num_mixed_batches > 0 or not mixed
    assert_memory_all_free(sched)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sampling_and_logprobs_under_the_mask(model_path, prompts, backend):
    sched = make_scheduler(model_path, grammar_backend=backend)
    tok = sched.tokenizer
    reqs = []
    for i, p in enumerate(prompts):
        r = _req(f"s{i}", p, regex=GRAMMAR_REGEX, return_logprob=True)
        r.sampling_params.temperature, r.sampling_params.top_k = 1.5, 1 << 30
        reqs.append(r)
        reqs.append(_req(f"g{i}", p, regex=GRAMMAR_REGEX, return_logprob=True, top_logprobs_num=3))
    out = _run(sched, reqs)
    for rid, res in out.items():
        assert re.fullmatch(GRAMMAR_REGEX, _text(tok, res.output_ids)), rid
        # Logprobs of the masked distribution: every chosen token had a finite one.
        assert len(res.output_logprobs) == len(res.output_ids)
        assert all(math.isfinite(lp) for lp in res.output_logprobs), (rid, res.output_logprobs)
    assert_memory_all_free(sched)


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no_overlap"])
def test_chunked_prefill_and_retraction_keep_the_matcher_in_step(model_path, overlap):
    """A 120-token prompt in 32-token chunks and a pool too small for everyone: requests are
    retracted and re-prefilled mid-grammar, yet every output still satisfies its regex."""
    rng = random.Random(9)
    long_regex = r"(yes|no)(-[0-9]{3}){8}"  # ~35 tokens: Qwen splits digits
    sched = make_scheduler(
        model_path,
        max_total_tokens=240,
        chunked_prefill_size=32,
        disable_overlap_schedule=not overlap,
    )
    prompts = [[rng.randrange(100, 50_000) for _ in range(n)] for n in [120] + [20] * 11]
    reqs = [_req(f"r{i}", p, 40, regex=long_regex) for i, p in enumerate(prompts)]
    out = _run(sched, reqs)
    for rid, res in out.items():
        assert re.fullmatch(long_regex, _text(sched.tokenizer, res.output_ids)), rid
    assert sched.stats.num_retracted_reqs > 0
    assert sched.stats.memory_check_failures == 0
    assert_memory_all_free(sched)


# Each backend's own text for the bad regex, after SGLang's "Invalid grammar request" prefix.
_BAD_REGEX_REASON = {
    "xgrammar": "Regex parsing error",
    "llguidance": "unclosed group",
    "outlines": "Failed to build DFA",
}


@pytest.mark.parametrize("backend", BACKENDS)
def test_invalid_constraints_are_400_and_hold_nothing(model_path, prompts, backend):
    sched = make_scheduler(model_path, grammar_backend=backend)
    bad = {"regex": "(ab", "json_schema": '{"type": "nope"}', "ebnf": "root ::= undefined"}
    for attempt in range(2):  # the second time the invalid grammar comes from the cache
        out = _run(sched, [_req(f"{k}{attempt}", prompts[0], **{k: v}) for k, v in bad.items()])
        for k in bad:
            reason = out[f"{k}{attempt}"].finish_reason
            assert reason["type"] == "abort" and reason["status_code"] == 400, reason
            assert reason["message"].startswith("Invalid grammar request: req.grammar_key=")
        assert all(not r.output_ids for r in out.values())
    assert _BAD_REGEX_REASON[backend] in out["regex1"].finish_reason["message"]
    if backend == "outlines":  # any ebnf is refused by name
        ok = _run(sched, [_req("eb", prompts[0], ebnf=GRAMMAR_EBNF)])["eb"].finish_reason
        assert ok["status_code"] == 400 and "outlines grammar backend" in ok["message"]
    assert_memory_all_free(sched)


def test_grammar_backend_none_refuses_with_sglangs_message(model_path, prompts):
    sched = make_scheduler(model_path, grammar_backend="none")
    out = _run(sched, [_req("r", prompts[0], regex=GRAMMAR_REGEX), _req("p", prompts[0], 4)])
    assert out["r"].finish_reason["status_code"] == 400
    assert "--grammar-backend none" in out["r"].finish_reason["message"]
    assert out["p"].finish_reason == {"type": "stop", "matched": out["p"].output_ids[-1]} or (
        out["p"].finish_reason["type"] == "length"
    )
    assert_memory_all_free(sched)


def test_abort_reaches_compiling_and_running_grammar_requests(model_path, prompts):
    sched = make_scheduler(model_path)
    start = len(sched.test_outputs)
    # A schema never seen before is compiling on a worker thread when the abort arrives.
    sched.add_request(_req("compiling", prompts[0], json_schema='{"type": "array"}'))
    sched.process_input_requests([AbortReq(rid="compiling")])
    sched.add_request(_req("running", prompts[1], 40, regex=r"[a-z]{30}"))
    for _ in range(3):
        sched.run_step()
    sched.process_input_requests([AbortReq(rid="running")])
    sched.run_until_idle()
    out = collect_outputs(sched.test_outputs[start:])
    assert out["compiling"].finish_reason["type"] == "abort"
    assert out["running"].finish_reason["type"] == "abort"
    assert not sched.grammar.queue
    assert_memory_all_free(sched)

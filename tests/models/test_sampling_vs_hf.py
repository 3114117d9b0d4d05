"""Sampling parameters and logprobs through the real in-process Scheduler on a tiny random
Llama, checked against transformers with the same weights (float32, CPU).

- logprobs: prompt positions are log_softmax(raw logits) (first entry None), output
  positions log_softmax(logits / temperature), top-k and token_ids entries likewise, all
  within 1e-3 of transformers' logits (SGLang 0.5.4 scales only output logprobs).
- greedy with penalties equals a reference greedy loop over transformers' logits
  (repetition_penalty equals transformers' own RepetitionPenaltyLogitsProcessor).
- logit_bias, min_new_tokens, stop_token_ids, stop strings spanning token boundaries,
  max_new_tokens=0 / None, and seeded sampling independent of the batch companions.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

from mini_sglang.managers.io_struct.generate import TokenizedGenerateReqInput
from mini_sglang.sampling.sampling_params import SamplingParams
from tests.conftest import assert_memory_all_free, build_tiny_model, make_scheduler

ATOL = 1e-3
PROMPTS = ["Hello world, this is", "The capital of France is", "def f(x):\n    return"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, qwen_tokenizer):
    path = tmp_path_factory.mktemp("tiny_sampling")
    model = build_tiny_model("llama", path, qwen_tokenizer)
    return str(path), model, qwen_tokenizer


@pytest.fixture(scope="module")
def scheduler(tiny):
    return make_scheduler(tiny[0])


def prompt_ids(tok, i: int) -> list[int]:
    return tok.encode(PROMPTS[i])


def run(scheduler, reqs: list[TokenizedGenerateReqInput], stagger: int = 0) -> dict[str, dict]:
    """Run requests to completion; per rid, every BatchTokenIDOutput field concatenated.

    With ``stagger``, request i is added after i * stagger scheduler steps (it joins while
    earlier ones decode)."""
    start = len(scheduler.test_outputs)
    for i, r in enumerate(reqs):
        for _ in range(stagger if i else 0):
            scheduler.run_step()
        scheduler.add_request(r)
    scheduler.run_until_idle()
    results: dict[str, dict] = {}
    for msg in scheduler.test_outputs[start:]:
        for j, rid in enumerate(msg.rids):
            res = results.setdefault(rid, {"output_ids": [], "finish_reason": None})
            res["output_ids"] += msg.output_ids[j]
            res["finish_reason"] = msg.finished_reasons[j]
            res["completion_tokens"] = msg.completion_tokens[j]
            for name in (
                "input_token_logprobs_val",
                "output_token_logprobs_val",
                "input_top_logprobs_val",
                "input_top_logprobs_idx",
                "output_top_logprobs_val",
                "output_top_logprobs_idx",
                "input_token_ids_logprobs_val",
                "output_token_ids_logprobs_val",
            ):
                values = getattr(msg, name, None)
                if values is not None:
                    res.setdefault(name, []).extend(values[j])
    assert_memory_all_free(scheduler)
    return results


def req(rid: str, ids: list[int], seed: int | None = None, tok=None, **kw: Any):
    """A TokenizedGenerateReqInput as the TokenizerManager makes it (``sampling_seed`` only
    takes effect when the client gave it: ``seed_given``)."""
    lp = {
        k: kw.pop(k)
        for k in ("return_logprob", "logprob_start_len", "top_logprobs_num", "token_ids_logprob")
        if k in kw
    }
    kw.setdefault("max_new_tokens", 8)
    if seed is not None:
        kw["sampling_seed"] = seed
    sp = SamplingParams(**kw)
    sp.normalize(tok)
    sp.verify(200_000)
    sp.seed_given = seed is not None
    return TokenizedGenerateReqInput(
        rid=rid, input_text="", input_ids=list(ids), sampling_params=sp, **lp
    )


@torch.no_grad()
def hf_logits(model, ids: list[int]) -> torch.Tensor:
    """transformers' float32 logits at every position of ``ids`` ([len, V])."""
    return model(torch.tensor([ids])).logits[0].float()


@torch.no_grad()
def hf_greedy_loop(
    model, prompt: list[int], steps: int, adjust: Callable[[torch.Tensor, list[int]], torch.Tensor]
) -> list[int]:
    """Greedy decoding over transformers' logits, ``adjust(logits, output_so_far)`` first."""
    out: list[int] = []
    for _ in range(steps):
        logits = hf_logits(model, prompt + out)[-1]
        out.append(int(adjust(logits, out).argmax()))
    return out


# ---- logprobs ---------------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_logprobs_match_hf(tiny, scheduler, temperature):
    _, model, tok = tiny
    ids = prompt_ids(tok, 1)
    watch = [ids[0], 13, 1000]
    r = req(
        "lp",
        ids,
        seed=7,
        temperature=temperature,
        top_k=5,
        max_new_tokens=6,
        ignore_eos=True,
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=3,
        token_ids_logprob=watch,
    )
    res = run(scheduler, [r])["lp"]
    out = res["output_ids"]
    assert len(out) == 6
    logits = hf_logits(model, ids + out[:-1])
    raw = torch.log_softmax(logits, -1)
    scaled = torch.log_softmax(logits / (temperature or 1.0), -1)
    # Prompt: position 0 has no logprob; position k comes from row k - 1, unscaled.
    in_vals = res["input_token_logprobs_val"]
    assert len(in_vals) == len(ids) and in_vals[0] is None
    expected_in = [raw[k - 1, ids[k]].item() for k in range(1, len(ids))]
    assert in_vals[1:] == pytest.approx(expected_in, abs=ATOL)
    assert res["input_top_logprobs_val"][0] is None
    for k in range(1, len(ids)):
        top = raw[k - 1].topk(3)
        assert res["input_top_logprobs_val"][k] == pytest.approx(top.values.tolist(), abs=ATOL)
        assert res["input_top_logprobs_idx"][k] == top.indices.tolist()
        assert res["input_token_ids_logprobs_val"][k] == pytest.approx(
            raw[k - 1, watch].tolist(), abs=ATOL
        )
    # Output: after temperature; the sampled token is always within transformers' top 5.
    for j, t in enumerate(out):
        row = scaled[len(ids) - 1 + j]
        assert t in row.topk(5).indices.tolist()
        assert res["output_token_logprobs_val"][j] == pytest.approx(row[t].item(), abs=ATOL)
        top = row.topk(3)
        assert res["output_top_logprobs_val"][j] == pytest.approx(top.values.tolist(), abs=ATOL)
        assert res["output_top_logprobs_idx"][j] == top.indices.tolist()
        assert res["output_token_ids_logprobs_val"][j] == pytest.approx(
            row[watch].tolist(), abs=ATOL
        )


@pytest.mark.parametrize("start", [2, -1])
def test_logprob_start_len_inside_the_prompt(tiny, scheduler, start):
    """SGLang 0.5.4 reports positions start..P-1 and the first of them is always None
    (-1 means P - 1: a single [None] entry for the last prompt token)."""
    _, model, tok = tiny
    ids = prompt_ids(tok, 2)
    r = req(
        "mid", ids, temperature=0.0, max_new_tokens=2, return_logprob=True, logprob_start_len=start
    )
    res = run(scheduler, [r])["mid"]
    raw = torch.log_softmax(hf_logits(model, ids), -1)
    s = start if start >= 0 else len(ids) - 1
    expected = [raw[k - 1, ids[k]].item() for k in range(s + 1, len(ids))]
    vals = res["input_token_logprobs_val"]
    assert vals[0] is None and vals[1:] == pytest.approx(expected, abs=ATOL)


# ---- penalties and biases (greedy, exact) ---------------------------------------------
@pytest.mark.parametrize("penalty", [0.5, 1.8])
def test_repetition_penalty_matches_transformers_generate(tiny, scheduler, penalty):
    _, model, tok = tiny
    ids = prompt_ids(tok, 0)
    steps = 12
    hf = model.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        do_sample=False,
        max_new_tokens=steps,
        repetition_penalty=penalty,
        eos_token_id=None,
        pad_token_id=0,
    )[0, len(ids) :].tolist()
    plain = run(scheduler, [req("p", ids, temperature=0, max_new_tokens=steps, ignore_eos=True)])
    res = run(
        scheduler,
        [
            req(
                "rp",
                ids,
                temperature=0,
                max_new_tokens=steps,
                ignore_eos=True,
                repetition_penalty=penalty,
            )
        ],
    )
    assert res["rp"]["output_ids"] == hf
    if penalty < 1:  # rewards repeats: the random model's output really changes
        assert plain["p"]["output_ids"] != hf


def test_frequency_presence_and_logit_bias_match_reference_loop(tiny, scheduler):
    _, model, tok = tiny
    ids = prompt_ids(tok, 1)
    steps, freq, pres = 10, 1.5, 0.7
    bias = {str(ids[-1]): 2.0, "13": 1.0}

    def adjust(logits: torch.Tensor, out: list[int]) -> torch.Tensor:
        logits = logits.clone()
        for t in set(out):
            logits[t] -= freq * out.count(t) + pres
        for t, b in bias.items():
            logits[int(t)] += b
        return logits

    expected = hf_greedy_loop(model, ids, steps, adjust)
    sp = dict(temperature=0, max_new_tokens=steps, ignore_eos=True)
    r = req("fp", ids, frequency_penalty=freq, presence_penalty=pres, logit_bias=bias, **sp)
    # A companion without penalties joins mid-way (batch merge with one side unpenalised).
    other = req("o", prompt_ids(tok, 2), **sp)
    res = run(scheduler, [r, other], stagger=3)
    assert res["fp"]["output_ids"] == expected
    assert res["o"]["output_ids"] == hf_greedy_loop(
        model, prompt_ids(tok, 2), steps, lambda x, o: x
    )


def test_logit_bias_forces_a_token(tiny, scheduler):
    _, _, tok = tiny
    forced = 4096
    res = run(
        scheduler,
        [req("b", prompt_ids(tok, 0), temperature=0.8, logit_bias={str(forced): 100.0}, seed=1)],
    )
    assert res["b"]["output_ids"] == [forced] * 8


def test_min_new_tokens_suppresses_stop_token_then_stops(tiny, scheduler):
    _, model, tok = tiny
    ids = prompt_ids(tok, 0)
    greedy = hf_greedy_loop(model, ids, 16, lambda x, o: x)
    stop = greedy[1]  # would stop at the 2nd token without min_new_tokens
    hf = model.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        do_sample=False,
        max_new_tokens=16,
        min_new_tokens=5,
        eos_token_id=stop,
        pad_token_id=0,
    )[0, len(ids) :].tolist()
    sp = dict(temperature=0, max_new_tokens=16, stop_token_ids=[stop])
    res = run(scheduler, [req("m", ids, min_new_tokens=5, **sp), req("s", ids, **sp)])
    assert res["s"]["output_ids"] == greedy[:2]
    assert res["s"]["finish_reason"] == {"type": "stop", "matched": stop}
    m = res["m"]
    assert len(m["output_ids"]) > 5 and stop not in m["output_ids"][:5]
    assert m["output_ids"] == hf[: len(m["output_ids"])]
    if m["output_ids"][-1] == stop:
        assert m["finish_reason"] == {"type": "stop", "matched": stop}


def test_ignore_eos_overrides_stop_token_ids(tiny, scheduler):
    _, model, tok = tiny
    ids = prompt_ids(tok, 0)
    greedy = hf_greedy_loop(model, ids, 6, lambda x, o: x)
    sp = dict(temperature=0, max_new_tokens=6, stop_token_ids=[greedy[1]], ignore_eos=True)
    res = run(scheduler, [req("i", ids, **sp)])["i"]
    assert res["output_ids"] == greedy
    assert res["finish_reason"] == {"type": "length", "length": 6}


def test_stop_string_spanning_token_boundary(tiny, scheduler):
    _, model, tok = tiny
    ids = prompt_ids(tok, 2)
    greedy = hf_greedy_loop(model, ids, 12, lambda x, o: x)
    pieces = [tok.decode([t]) for t in greedy]
    # A stop string made of the end of token k and the start of token k + 1.
    k = next(
        i
        for i in range(2, 11)
        if len(pieces[i]) >= 2
        and len(pieces[i + 1]) >= 2
        and tok.decode(greedy[: i + 1]).endswith(pieces[i])
    )
    stop = pieces[k][-2:] + pieces[k + 1][:2]
    first = tok.decode(greedy).find(stop)
    # The stop must first occur across tokens k, k + 1 (else pick a later k by hand).
    assert first == len(tok.decode(greedy[:k])) + len(pieces[k]) - 2, (pieces, stop)
    res = run(scheduler, [req("ss", ids, tok=tok, temperature=0, max_new_tokens=12, stop=stop)])
    assert res["ss"]["output_ids"] == greedy[: k + 2]
    assert res["ss"]["finish_reason"] == {"type": "stop", "matched": stop}
    # The same stop as a regex (a character class for its first character) stops there too.
    pattern = "[" + re.escape(stop[0]) + "]" + re.escape(stop[1:])
    res = run(
        scheduler, [req("sr", ids, tok=tok, temperature=0, max_new_tokens=12, stop_regex=pattern)]
    )
    assert res["sr"]["output_ids"] == greedy[: k + 2]
    assert res["sr"]["finish_reason"] == {"type": "stop", "matched": pattern}


# ---- lengths ----------------------------------------------------------------------------
def test_max_new_tokens_zero_is_prefill_only_and_caches_the_prompt(tiny, scheduler):
    _, _, tok = tiny
    ids = prompt_ids(tok, 2) + [11, 12, 13]
    res = run(scheduler, [req("z", ids, max_new_tokens=0, return_logprob=True)])["z"]
    assert res["output_ids"] == [] and res["completion_tokens"] == 0
    assert res["finish_reason"] == {"type": "length", "length": 0}
    assert res.get("output_token_logprobs_val", []) == []
    match = scheduler.tree_cache.match_prefix(ids)
    assert len(match.device_indices) == len(ids)


def test_max_new_tokens_none_runs_to_the_context_limit(tiny):
    path, _, tok = tiny
    sched = make_scheduler(path, context_length=40)
    ids = prompt_ids(tok, 0)
    res = run(sched, [req("n", ids, temperature=0, max_new_tokens=None, ignore_eos=True)])["n"]
    room = (40 - 1) - len(ids) - 1  # max_req_len - input - 1, as SGLang
    assert res["finish_reason"] == {"type": "length", "length": room}
    assert len(res["output_ids"]) == room


# ---- seeds ------------------------------------------------------------------------------
def test_same_seed_same_output_whatever_the_batch(tiny, scheduler):
    _, _, tok = tiny
    sp = dict(temperature=1.3, top_p=0.95, max_new_tokens=10, ignore_eos=True)
    alone = run(scheduler, [req("a", prompt_ids(tok, 0), seed=1234, **sp)])["a"]["output_ids"]
    companions = [
        req("c0", prompt_ids(tok, 1), **sp),  # unseeded
        req("c1", prompt_ids(tok, 2), seed=1234, top_k=3, temperature=0.5, max_new_tokens=4),
        req("c2", prompt_ids(tok, 0)[:3], temperature=0, max_new_tokens=12),
    ]
    res = run(
        scheduler,
        [companions[0], req("b", prompt_ids(tok, 0), seed=1234, **sp), *companions[1:]],
        stagger=2,
    )
    assert res["b"]["output_ids"] == alone
    other_seed = run(scheduler, [req("d", prompt_ids(tok, 0), seed=99, **sp)])["d"]["output_ids"]
    assert other_seed != alone

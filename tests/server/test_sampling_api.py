"""Sampling parameters through the real server's /generate (tiny random Llama, CPU).

Validation errors (400 naming the parameter and its range), n > 1 (a hidden prefill-only
request caches the prompt first, so the n copies hit the radix cache; streams carry
`index`), logprobs in the JSON equal transformers' log_softmax, stop strings and stop
tokens, special-token flags, and UTF-8 streams that never show a U+FFFD the final text
lacks. One shared server (conftest `server`).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import torch

from tests.server.conftest import ServerHandle, TinyModel, parse_sse

ATOL = 1e-3


def generate(server: ServerHandle, body: dict) -> Any:
    r = server.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def stream(server: ServerHandle, body: dict) -> list[dict]:
    r = server.post("/generate", json={**body, "stream": True})
    assert r.status_code == 200, r.text
    return parse_sse(r.content)


def fresh_prompt() -> str:
    """A prompt no earlier test cached (uuid hex), so cached_tokens are this test's own."""
    return f"Sample {uuid.uuid4().hex} now"


# ---- validation -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "params, needles",
    [
        ({"temperature": -1}, ["temperature", "non-negative"]),
        ({"top_p": 0}, ["top_p", "(0, 1]"]),
        ({"top_k": 0}, ["top_k", "-1", "at least 1"]),
        ({"min_p": 1.5}, ["min_p", "[0, 1]"]),
        ({"frequency_penalty": 2.5}, ["frequency_penalty", "[-2, 2]"]),
        ({"presence_penalty": -3}, ["presence_penalty", "[-2, 2]"]),
        ({"repetition_penalty": 2.5}, ["repetition_penalty", "[0, 2]"]),
        ({"max_new_tokens": -1}, ["max_new_tokens", "at least 0"]),
        ({"max_new_tokens": 2, "min_new_tokens": 3}, ["min_new_tokens", "max_new_tokens(2)"]),
        ({"logit_bias": {"99999999": 1.0}}, ["logit_bias", "[0, "]),
        ({"n": 0}, ["n must be at least 1"]),
        ({"temperature": "hot"}, ["temperature", "number"]),
        ({"stop": 5}, ["stop", "string"]),
        ({"stop_regex": "("}, ["stop_regex", "regular expression"]),
        ({"bogus_key": 1}, ["bogus_key", "Unknown sampling parameter"]),
        ({"json_schema": "{not json"}, ["Invalid grammar request", "'json'"]),
        ({"regex": "(a"}, ["Invalid grammar request", "'regex'"]),
        ({"ebnf": "root ::= undefined_rule"}, ["Invalid grammar request", "'ebnf'"]),
        ({"json_schema": {"type": "object"}}, ["json_schema", "must be a string"]),
        ({"regex": "a", "ebnf": "root ::= 'a'"}, ["Only one of regex, json_schema, or ebnf"]),
        ({"structural_tag": "{}"}, ["structural_tag", "not supported"]),
    ],
)
def test_invalid_sampling_params_are_400_naming_the_parameter(server, params, needles):
    r = server.post("/generate", json={"text": "hi", "sampling_params": params})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    for needle in needles:
        assert needle in message, message


# ---- n > 1 ------------------------------------------------------------------------------
def test_n_copies_hit_the_cached_prompt_and_come_back_in_order(server, tokenizer):
    prompts = [fresh_prompt(), fresh_prompt() + " and more"]
    sp = {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True, "n": 2}
    out = generate(server, {"text": prompts, "sampling_params": sp})
    assert isinstance(out, list) and len(out) == 4
    singles = [
        generate(server, {"text": p, "sampling_params": {**sp, "n": 1}})["output_ids"]
        for p in prompts
    ]
    for k, res in enumerate(out):  # prompt-major: k // n is the prompt
        prompt_len = len(tokenizer.encode(prompts[k // 2]))
        assert res["output_ids"] == singles[k // 2]
        assert res["meta_info"]["prompt_tokens"] == prompt_len
        # The hidden max_new_tokens=0 request prefilled the prompt before the copies ran.
        assert res["meta_info"]["cached_tokens"] == prompt_len - 1
    server.wait_memory_all_free()


def test_n4_stream_has_four_cumulative_streams(server, tokenizer):
    sp = {"temperature": 1.0, "max_new_tokens": 8, "ignore_eos": True, "n": 4}
    events = stream(server, {"text": fresh_prompt(), "sampling_params": sp})
    by_index: dict[int, list[dict]] = {}
    for e in events:
        by_index.setdefault(e["index"], []).append(e)
    assert sorted(by_index) == [0, 1, 2, 3]
    finals = []
    for evs in by_index.values():
        texts = [e["text"] for e in evs]
        assert all(b.startswith(a) for a, b in zip(texts, texts[1:])), texts
        ids = [t for e in evs for t in e["output_ids"]]  # 0.5.4: deltas per event
        assert len(ids) == 8 and evs[-1]["meta_info"]["completion_tokens"] == 8
        assert evs[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 8}
        assert all(e["meta_info"]["finish_reason"] is None for e in evs[:-1])
        assert texts[-1] == tokenizer.decode(ids, skip_special_tokens=True)
        finals.append(tuple(ids))
    assert len(set(finals)) > 1  # unseeded samples differ


# ---- logprobs in the JSON ---------------------------------------------------------------
def test_logprob_triples_match_transformers(server, tokenizer, hf_model):
    ids = tokenizer.encode(fresh_prompt())
    body = {
        "input_ids": ids,
        "sampling_params": {"temperature": 0.8, "max_new_tokens": 4, "ignore_eos": True},
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": 2,
        "token_ids_logprob": [ids[1], 100],
        "return_text_in_logprobs": True,
    }
    meta = generate(server, body)
    out = meta["output_ids"]
    meta = meta["meta_info"]
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids + out[:-1]])).logits[0].float()
    raw = torch.log_softmax(logits, -1)
    scaled = torch.log_softmax(logits / 0.8, -1)
    inp = meta["input_token_logprobs"]
    assert inp[0] == [None, ids[0], tokenizer.decode([ids[0]])]
    for k in range(1, len(ids)):
        lp, tid, text = inp[k]
        assert tid == ids[k] and text == tokenizer.decode([ids[k]])
        assert lp == pytest.approx(raw[k - 1, ids[k]].item(), abs=ATOL)
        top = meta["input_top_logprobs"][k]
        assert [t[1] for t in top] == raw[k - 1].topk(2).indices.tolist()
        assert [t[0] for t in top] == pytest.approx(raw[k - 1].topk(2).values.tolist(), abs=ATOL)
    assert meta["input_top_logprobs"][0] is None
    assert meta["input_token_ids_logprobs"][0] is None
    for j, t in enumerate(out):
        row = scaled[len(ids) - 1 + j]
        lp, tid, text = meta["output_token_logprobs"][j]
        assert tid == t and text == tokenizer.decode([t])
        assert lp == pytest.approx(row[t].item(), abs=ATOL)
        top = meta["output_top_logprobs"][j]
        assert [x[1] for x in top] == row.topk(2).indices.tolist()
        watched = meta["output_token_ids_logprobs"][j]
        assert [x[1] for x in watched] == [ids[1], 100]
        assert [x[0] for x in watched] == pytest.approx(row[[ids[1], 100]].tolist(), abs=ATOL)


def test_non_stream_body_is_json_dumps(server):
    """SGLang returns /generate's dict through FastAPI's default JSONResponse: json.dumps,
    compact, so a logprob near 0 reads -2e-06 (orjson writes -0.000002). A large logit bias
    makes the greedy token's logprob that small."""
    body = {
        # fixed: the logprobs (float32 steps of 1.2e-07 near 0) depend on the prompt, and
        # this one's are -8.4e-05 and -8.3e-06, below json.dumps' 1e-04 exponent threshold
        "text": "Numbers in JSON:",
        "sampling_params": {"temperature": 0, "max_new_tokens": 2, "logit_bias": {"100": 25}},
        "return_logprob": True,
    }
    r = server.post("/generate", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["output_ids"] == [100, 100]
    assert r.text == json.dumps(r.json(), ensure_ascii=False, separators=(",", ":"))
    assert "e-0" in r.text  # the tiny logprobs are in exponent form


def test_logprobs_without_text_carry_null(server):
    body = {
        "text": "hello",
        "sampling_params": {"temperature": 0, "max_new_tokens": 2},
        "return_logprob": True,
    }
    meta = generate(server, body)["meta_info"]
    assert all(t[2] is None for t in meta["output_token_logprobs"])
    assert len(meta["input_token_logprobs"]) == 1  # default start: the last prompt token
    assert meta["input_token_logprobs"][0][0] is None


# ---- stops and special tokens -----------------------------------------------------------
def test_stop_string_across_tokens_trimmed_and_never_streamed(server, tokenizer):
    prompt = fresh_prompt()
    sp = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}
    full = generate(server, {"text": prompt, "sampling_params": sp})
    ids = full["output_ids"]
    pieces = [tokenizer.decode([t]) for t in ids]
    text = full["text"]
    # Find a stop string made of the end of one token and the start of the next, whose
    # first occurrence in the text is exactly that boundary.
    stop = None
    for k in range(1, len(ids) - 1):
        a, b = pieces[k], pieces[k + 1]
        if len(a) >= 2 and len(b) >= 1 and tokenizer.decode(ids[: k + 1]).endswith(a):
            cand = a[-2:] + b[:1]
            at = len(tokenizer.decode(ids[: k + 1])) - 2
            if text.find(cand) == at and "\ufffd" not in cand:
                stop = (k, cand, at)
                break
    assert stop is not None, pieces
    k, cand, at = stop
    res = generate(server, {"text": prompt, "sampling_params": {**sp, "stop": [cand, "zzzq"]}})
    assert res["meta_info"]["finish_reason"] == {"type": "stop", "matched": cand}
    assert res["output_ids"] == ids[: k + 2]
    assert res["text"] == text[:at]
    kept = generate(
        server, {"text": prompt, "sampling_params": {**sp, "stop": cand, "no_stop_trim": True}}
    )
    assert kept["text"] == tokenizer.decode(ids[: k + 2]) and cand in kept["text"]
    events = stream(
        server, {"text": prompt, "sampling_params": {**sp, "stop": cand, "stream_interval": 1}}
    )
    for e in events:
        assert cand not in e["text"] and text[:at].startswith(e["text"])
    assert events[-1]["text"] == text[:at]


def test_stop_token_ids_finish_with_the_id(server, tiny_model: TinyModel):
    stop = tiny_model.greedy_ids[1]
    sp = {"temperature": 0, "max_new_tokens": 10, "stop_token_ids": [stop], "ignore_eos": False}
    res = generate(server, {"input_ids": tiny_model.eos_prompt_ids, "sampling_params": sp})
    n = tiny_model.greedy_ids.index(stop) + 1
    assert res["output_ids"] == tiny_model.greedy_ids[:n]
    assert res["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert res["meta_info"]["completion_tokens"] == n


@pytest.mark.parametrize("skip, spaces", [(True, True), (False, True), (False, False)])
def test_special_token_flags(server, tokenizer, skip, spaces):
    special = tokenizer.convert_tokens_to_ids("<|im_start|>")
    word = tokenizer.encode(" cat")[0]
    sp = {
        "temperature": 1.0,
        "sampling_seed": 3,
        "max_new_tokens": 8,
        "ignore_eos": True,
        "logit_bias": {str(special): 100.0, str(word): 100.0},
        "skip_special_tokens": skip,
        "spaces_between_special_tokens": spaces,
    }
    res = generate(server, {"text": "x", "sampling_params": sp})
    ids = res["output_ids"]
    assert set(ids) <= {special, word} and special in ids
    assert res["text"] == tokenizer.decode(
        ids, skip_special_tokens=skip, spaces_between_special_tokens=spaces
    )


def test_utf8_byte_tokens_stream_without_spurious_replacement_chars(server, tokenizer):
    # Byte-level tokens 0xC3 and 0xA9 ("é" = C3 A9): random orders make both complete
    # characters and invalid bytes; a stream may show U+FFFD only where the final text does.
    c3, a9 = tokenizer.convert_tokens_to_ids(["Ã", "©"])
    sp = {
        "temperature": 1.0,
        "max_new_tokens": 24,
        "ignore_eos": True,
        "logit_bias": {str(c3): 100.0, str(a9): 100.0},
        "stream_interval": 1,
    }
    saw_complete = False
    for seed in range(3):
        events = stream(server, {"text": "x", "sampling_params": {**sp, "sampling_seed": seed}})
        final = events[-1]["text"]
        ids = [t for e in events for t in e["output_ids"]]
        assert final == tokenizer.decode(ids)
        for e in events:
            assert final.startswith(e["text"]), (e["text"], final)
        saw_complete |= "é" in final
    assert saw_complete


# ---- lengths and seeds ------------------------------------------------------------------
def test_max_new_tokens_zero(server):
    res = generate(server, {"text": fresh_prompt(), "sampling_params": {"max_new_tokens": 0}})
    assert res["text"] == "" and res["output_ids"] == []
    assert res["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    assert res["meta_info"]["completion_tokens"] == 0


def test_same_seed_same_text_with_other_requests_in_the_batch(server):
    sp = {"temperature": 1.0, "max_new_tokens": 8, "ignore_eos": True, "sampling_seed": 77}
    alone = generate(server, {"text": "Seeded prompt", "sampling_params": sp})["output_ids"]
    batch = generate(
        server,
        {
            "text": ["Another one", "Seeded prompt", "Third"],
            "sampling_params": [{**sp, "sampling_seed": 5}, sp, {"max_new_tokens": 3}],
        },
    )
    assert batch[1]["output_ids"] == alone
    assert batch[0]["output_ids"] != alone

"""Structured outputs through the real multi-process server: native /generate with
json_schema / regex / ebnf, OpenAI response_format (json_schema, json_object, text) and the
SGLang extras, mixed batches, and the 400s (invalid or conflicting constraints).

The shared server on the tiny random Llama with --constrained-json-disable-any-whitespace
(conftest `compact_json_server`: a random model given free whitespace inside JSON may emit
it forever). A representative subset (json_schema, regex, ebnf, invalid constraints) also
runs on one server per other grammar backend (llguidance, outlines).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from tests.conftest import (
    GRAMMAR_EBNF,
    GRAMMAR_EBNF_RE,
    GRAMMAR_REGEX,
    PERSON_SCHEMA,
    check_person_json,
)
from tests.server.conftest import (
    COMPACT_JSON_ARGS,
    ServerHandle,
    TinyModel,
    launch_server,
    parse_sse,
)

REGEX, EBNF, SCHEMA = GRAMMAR_REGEX, GRAMMAR_EBNF, PERSON_SCHEMA
PROMPTS = ["Answer me:", "The weather today", "List three colors:"]


@pytest.fixture(scope="module")
def gserver(compact_json_server: ServerHandle) -> ServerHandle:
    return compact_json_server


@pytest.fixture(scope="module")
def client(gserver: ServerHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gserver.base_url}/v1", api_key="x", max_retries=0)


def _generate(server: ServerHandle, text: str, **sp) -> dict:
    body = {"text": text, "sampling_params": {"temperature": 0, "max_new_tokens": 48, **sp}}
    r = server.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_native_constraints_in_a_mixed_batch(gserver: ServerHandle) -> None:
    """Constrained and plain requests run concurrently; the plain ones keep the greedy
    tokens they get alone."""
    plain = {"max_new_tokens": 10, "ignore_eos": True}
    alone = [_generate(gserver, p, **plain)["output_ids"] for p in PROMPTS]
    jobs = []
    for p in PROMPTS:
        jobs += [
            (p, {"regex": REGEX}),
            (p, {"json_schema": json.dumps(SCHEMA)}),
            (p, {"ebnf": EBNF}),
            (p, plain),
        ]
    with ThreadPoolExecutor(len(jobs)) as pool:
        outs = list(pool.map(lambda job: _generate(gserver, job[0], **job[1]), jobs))
    for i in range(len(PROMPTS)):
        regex_out, json_out, ebnf_out, plain_out = outs[4 * i : 4 * i + 4]
        assert re.fullmatch(REGEX, regex_out["text"]), regex_out
        assert regex_out["meta_info"]["finish_reason"]["type"] == "stop"
        check_person_json(json_out["text"])
        assert re.fullmatch(GRAMMAR_EBNF_RE, ebnf_out["text"]), ebnf_out
        assert plain_out["output_ids"] == alone[i]
    gserver.wait_memory_all_free()


def test_native_stream_with_regex(gserver: ServerHandle) -> None:
    body = {"text": PROMPTS[0], "stream": True, "sampling_params": {"regex": REGEX}}
    r = gserver.post("/generate", json=body)
    events = [e for e in parse_sse(r.content) if e != "[DONE]"]
    assert re.fullmatch(REGEX, events[-1]["text"]), events[-1]


def test_openai_response_formats(client: openai.OpenAI, tiny_model: TinyModel) -> None:
    messages = [{"role": "user", "content": "Describe a person."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    chat = client.chat.completions.create(
        model="m", messages=messages, response_format=fmt, temperature=0, max_tokens=64
    )
    assert chat.choices[0].finish_reason == "stop"
    check_person_json(chat.choices[0].message.content)
    # json_object: any object. The bias makes "}" win once allowed, so the random model
    # closes the object at once; the grammar still forces the "{" and the end.
    from transformers import AutoTokenizer

    (close_id,) = AutoTokenizer.from_pretrained(tiny_model.path).encode(
        "}", add_special_tokens=False
    )
    obj = client.completions.create(
        model="m",
        prompt="Some JSON:",
        logit_bias={str(close_id): 100},
        # SGLang's completions take response_format too (the openai client's signature
        # does not list it).
        extra_body={"response_format": {"type": "json_object"}},
        temperature=0,
        max_tokens=16,
    )
    assert json.loads(obj.choices[0].text) == {}
    # The SGLang extras on completions, and "text" (no constraint).
    extra = client.completions.create(
        model="m", prompt="Q:", temperature=0, max_tokens=16, extra_body={"regex": REGEX}
    )
    assert re.fullmatch(REGEX, extra.choices[0].text)
    ebnf = client.chat.completions.create(
        model="m", messages=messages, temperature=0, max_tokens=16, extra_body={"ebnf": EBNF}
    )
    assert re.fullmatch(GRAMMAR_EBNF_RE, ebnf.choices[0].message.content)
    text = client.chat.completions.create(
        model="m", messages=messages, response_format={"type": "text"}, max_tokens=4
    )
    assert text.choices[0].finish_reason == "length"


def test_invalid_and_conflicting_constraints_are_400(
    client: openai.OpenAI, gserver: ServerHandle
) -> None:
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], response_format=bad
        )
    assert "Invalid grammar request" in str(e.value)
    r = gserver.post("/generate", json={"text": "hi", "sampling_params": {"regex": "(ab"}})
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith("Invalid grammar request: req.grammar_key=")
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(
            model="m", prompt="hi", extra_body={"regex": "a", "json_schema": "{}"}
        )
    assert "Only one of regex, json_schema, or ebnf can be set." in str(e.value)
    assert gserver.get("/health").status_code == 200
    assert _generate(gserver, "hi", regex=REGEX)["text"]  # the scheduler is fine
    m = gserver.wait_memory_all_free()
    assert m["failures"] == 0


def test_json_schema_shorthand_is_the_full_form(client: openai.OpenAI) -> None:
    """SGLang's chat also takes {"type": "json_schema", "schema": {...}} without the
    json_schema object: it is the same constraint, so greedy decoding gives the same JSON."""
    messages = [{"role": "user", "content": "Describe someone."}]
    full = {"type": "json_schema", "json_schema": {"name": "Schema", "schema": SCHEMA}}
    short = {"type": "json_schema", "schema": SCHEMA}
    replies = [
        client.chat.completions.create(
            model="m", messages=messages, response_format=fmt, temperature=0, max_tokens=64
        ).choices[0]
        for fmt in (full, short)
    ]
    assert replies[0].finish_reason == "stop"
    check_person_json(replies[0].message.content)
    assert replies[1].message.content == replies[0].message.content


def test_masked_token_logprobs_are_null_not_a_500(gserver: ServerHandle) -> None:
    """A grammar that allows one token leaves every other token at logprob -inf; a greedy
    request with top logprobs then reports them. JSON has no -inf: the body says null (as
    pydantic writes it) where json.dumps alone, SGLang's serialiser, would fail with a 500."""
    body = {
        "model": "m",
        "prompt": "Say a:",
        "max_tokens": 1,
        "temperature": 0,
        "logprobs": 3,
        "regex": "a",
    }
    r = gserver.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    (choice,) = r.json()["choices"]
    assert choice["text"] == "a"
    (top,) = choice["logprobs"]["top_logprobs"]
    values = list(top.values())
    assert values[0] is not None and values[0] == pytest.approx(0.0, abs=1e-5)
    assert None in values[1:], top


# ---- every grammar backend ------------------------------------------------------------------
# Each backend's own reasons after "Invalid grammar request: req.grammar_key=...".
BACKEND_REASONS = {
    "xgrammar": {"schema": "nope", "regex": "Regex parsing error"},
    "llguidance": {"schema": "Invalid type: nope", "regex": "unclosed group"},
    "outlines": {"schema": "Unsupported type: nope", "regex": "Failed to build DFA"},
}


@pytest.fixture(scope="module", params=list(BACKEND_REASONS))
def backend_server(request, tiny_model: TinyModel, server_logs: Path) -> Iterator[tuple]:
    """(backend name, its server); xgrammar's is the module server."""
    name = request.param
    if name == "xgrammar":
        yield name, request.getfixturevalue("gserver")
        return
    handle = launch_server(
        tiny_model.path, *COMPACT_JSON_ARGS, "--grammar-backend", name, log_dir=server_logs
    )
    yield name, handle
    handle.stop()


def test_every_backend_constrains_and_reports_its_own_errors(backend_server) -> None:
    name, server = backend_server
    # llguidance allows unlisted properties unless the schema forbids them (JSON Schema).
    schema = {**SCHEMA, "additionalProperties": False}
    jobs = [{"regex": REGEX}, {"json_schema": json.dumps(schema)}]
    with ThreadPoolExecutor(len(jobs)) as pool:
        regex_out, json_out = pool.map(lambda sp: _generate(server, PROMPTS[1], **sp), jobs)
    assert re.fullmatch(REGEX, regex_out["text"]), regex_out
    check_person_json(json_out["text"], bounds=name != "outlines")  # outlines: no bounds
    body = {"text": "hi", "sampling_params": {"ebnf": EBNF, "max_new_tokens": 16}}
    r = server.post("/generate", json=body)
    if name == "outlines":  # no ebnf: a 400 naming the backend
        assert r.status_code == 400, r.text
        assert "The outlines grammar backend does not support ebnf" in r.json()["error"]["message"]
    else:
        assert r.status_code == 200 and re.fullmatch(GRAMMAR_EBNF_RE, r.json()["text"]), r.text
    for kind, value in [("json_schema", '{"type": "nope"}'), ("regex", "(ab")]:
        r = server.post("/generate", json={"text": "hi", "sampling_params": {kind: value}})
        assert r.status_code == 400, r.text
        message = r.json()["error"]["message"]
        assert message.startswith("Invalid grammar request: req.grammar_key="), message
        assert BACKEND_REASONS[name]["schema" if kind == "json_schema" else "regex"] in message
    assert server.get("/health").status_code == 200
    assert server.wait_memory_all_free()["failures"] == 0

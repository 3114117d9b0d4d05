"""--reasoning-parser / --tool-call-parser through the real multi-process server.

The shared server on the tiny random Llama (real Qwen3 tokenizer and chat template, whose
`<think>`, `</think>`, `<tool_call>`, `</tool_call>` are single added tokens) started with
`--reasoning-parser qwen3 --tool-call-parser qwen25` (conftest `parser_server`). A random model writes no tags by
itself, so replies are shaped by constraints the server really decodes with: tool_choice
"required" / a named function (SGLang's JSON-schema constraint) or a `regex` extra.
Everything the constraint leaves free (argument values, reasoning words) is the model's
own greedy choice, and expectations are derived from the server's own raw output.
"""

from __future__ import annotations

import json
import re

import openai
import pytest
import requests
from jsonschema import Draft202012Validator, SchemaError

from tests.server.conftest import ServerHandle, TinyModel, parse_sse

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 6},
                "unit": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city", "unit"],
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": ["a"],
        },
    },
}
WEATHER_CHOICE = {"type": "function", "function": {"name": "get_weather"}}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
BASE = {"model": "m", "messages": MESSAGES, "temperature": 0, "max_tokens": 60}
CALL_ID = re.compile(r"call_[0-9a-f]{24}")
TOOL_CALL_KEYS = ["id", "index", "type", "function"]
DELTA_KEYS = ["role", "content", "reasoning_content", "tool_calls"]
# A Hermes-style call with a free city, after a free capitalised word.
QWEN_CALL_REGEX = (
    r'[A-Z][a-z]{1,5}\.\n<tool_call>\n\{"name": "get_weather", "arguments": '
    r'\{"city": "[a-z]{1,6}", "unit": "c"\}\}\n</tool_call>'
)
THINK_REGEX = r"<think>\n[a-z]{1,10}( [a-z]{1,8})?\n</think>\n\n[a-z]{1,8}"


@pytest.fixture(scope="module")
def pserver(parser_server: ServerHandle) -> ServerHandle:
    return parser_server


def _chat(server: ServerHandle, **body) -> dict:
    r = server.post("/v1/chat/completions", json={**BASE, **body})
    assert r.status_code == 200, r.text
    return r.json()


def _stream(server: ServerHandle, **body) -> list[dict]:
    r = server.post("/v1/chat/completions", json={**BASE, **body, "stream": True})
    assert r.status_code == 200, r.text
    return parse_sse(r.content)


def _collect(events: list[dict]) -> dict:
    """Concatenate a single-choice stream: content, reasoning, calls by index; check the
    shape of every chunk on the way."""
    out: dict = {"content": "", "reasoning": "", "calls": {}, "finish": None}
    assert events[0]["choices"][0]["delta"] == {
        "role": "assistant",
        "content": "",
        "reasoning_content": None,
        "tool_calls": None,
    }
    for event in events[1:]:
        assert event["object"] == "chat.completion.chunk" and event["id"] == events[0]["id"]
        (choice,) = event["choices"]
        delta = choice["delta"]
        assert list(delta) == DELTA_KEYS and delta["role"] is None
        set_fields = [k for k in DELTA_KEYS if delta[k] is not None]
        if choice["finish_reason"] is not None:
            assert set_fields == [] and event is events[-1]
            out["finish"] = (choice["finish_reason"], choice["matched_stop"])
            continue
        assert len(set_fields) == 1, delta  # one kind of delta per chunk (SGLang)
        if delta["content"] is not None:
            out["content"] += delta["content"]
        if delta["reasoning_content"] is not None:
            out["reasoning"] += delta["reasoning_content"]
        for call in delta["tool_calls"] or []:
            assert list(call) == TOOL_CALL_KEYS and call["type"] == "function"
            assert list(call["function"]) == ["name", "arguments"]
            if call["index"] not in out["calls"]:  # the first piece names the call
                assert CALL_ID.fullmatch(call["id"]) and call["function"]["arguments"] == ""
                out["calls"][call["index"]] = [call["function"]["name"], ""]
            else:
                assert call["id"] is None and call["function"]["name"] is None
                out["calls"][call["index"]][1] += call["function"]["arguments"]
    return out


def _check_weather_args(arguments: str) -> None:
    args = json.loads(arguments)
    assert set(args) == {"city", "unit"} and args["unit"] in ("c", "f"), args
    assert isinstance(args["city"], str) and len(args["city"]) <= 6


def test_named_tool_choice(pserver: ServerHandle, tiny_model: TinyModel) -> None:
    """A named function: the JSON-array constraint forces one call; non-stream and stream
    give the same call in SGLang's shapes."""
    body = {"tools": [WEATHER, ADD], "tool_choice": WEATHER_CHOICE}
    resp = _chat(pserver, **body)
    (choice,) = resp["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["matched_stop"] is None
    message = choice["message"]
    assert list(message) == DELTA_KEYS
    assert message["role"] == "assistant" and message["content"] is None
    assert message["reasoning_content"] is None
    (call,) = message["tool_calls"]
    assert list(call) == TOOL_CALL_KEYS and CALL_ID.fullmatch(call["id"])
    assert call["index"] == 0 and call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    _check_weather_args(call["function"]["arguments"])

    streamed = _collect(_stream(pserver, **body))
    assert streamed["calls"] == {0: ["get_weather", call["function"]["arguments"]]}
    assert streamed["content"] == "" and streamed["reasoning"] == ""
    # SGLang's stream keeps matched_stop (the EOS that ended the constrained reply).
    assert streamed["finish"] == ("tool_calls", tiny_model.eos_token_id)


def test_required_tool_choice_stream_equals_non_stream(pserver: ServerHandle) -> None:
    body = {"tools": [WEATHER, ADD], "tool_choice": "required", "max_tokens": 120}
    resp = _chat(pserver, **body)
    choice = resp["choices"][0]
    streamed = _collect(_stream(pserver, **body))
    if choice["finish_reason"] == "length":  # the model kept adding calls: no calls
        assert choice["message"]["tool_calls"] is None and choice["message"]["content"]
        return
    calls = choice["message"]["tool_calls"]
    assert choice["finish_reason"] == "tool_calls" and calls
    assert [c["index"] for c in calls] == list(range(len(calls)))
    assert streamed["calls"] == {
        c["index"]: [c["function"]["name"], c["function"]["arguments"]] for c in calls
    }
    for c in calls:
        assert c["function"]["name"] in ("get_weather", "add")
        assert isinstance(json.loads(c["function"]["arguments"]), dict)


def test_auto_tool_call_in_qwen_format(pserver: ServerHandle, tiny_model: TinyModel) -> None:
    """tool_choice auto: the model's own `<tool_call>` text (here forced by a regex) is
    parsed by the qwen25 detector; the answer before it stays content."""
    from transformers import AutoTokenizer

    from mini_sglang.entrypoints.openai.protocol import Function

    body = {"tools": [WEATHER], "regex": QWEN_CALL_REGEX}
    # The raw reply to the same prompt (the template renders each tool's function dict,
    # as SGLang passes it: pydantic's dump, strict included).
    tok = AutoTokenizer.from_pretrained(tiny_model.path)
    function = Function(**WEATHER["function"]).model_dump()
    ids = tok.apply_chat_template(
        MESSAGES, tools=[function], add_generation_prompt=True, tokenize=True
    )
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    params = {"temperature": 0, "max_new_tokens": 60, "regex": QWEN_CALL_REGEX}
    r = pserver.post(
        "/generate",
        json={"input_ids": ids, "sampling_params": {**params, "skip_special_tokens": False}},
    )
    raw = r.json()["text"]
    m = re.fullmatch(QWEN_CALL_REGEX.replace(r"\n", "\n"), raw)
    assert m, raw
    answer, call_json = raw.split("\n<tool_call>\n")
    expected_args = json.dumps(json.loads(call_json.split("\n</tool_call>")[0])["arguments"])

    resp = _chat(pserver, **body)
    (choice,) = resp["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["matched_stop"] is None
    assert choice["message"]["content"] == answer
    (call,) = choice["message"]["tool_calls"]
    # SGLang 0.5.4's format parsers leave the index of non-stream calls at -1.
    assert call["index"] == -1 and CALL_ID.fullmatch(call["id"])
    assert call["function"] == {"name": "get_weather", "arguments": expected_args}

    streamed = _collect(_stream(pserver, **body))
    assert streamed["content"] == answer
    assert streamed["calls"] == {0: ["get_weather", expected_args]}
    assert streamed["finish"][0] == "tool_calls"


def test_reasoning_content(pserver: ServerHandle) -> None:
    body = {"regex": THINK_REGEX}
    raw = _chat(pserver, **body, separate_reasoning=False)["choices"][0]["message"]
    assert raw["reasoning_content"] is None
    text = raw["content"]
    m = re.fullmatch(r"<think>\n(.*\n)</think>\n\n(.*)", text, re.S)
    assert m, text
    reasoning, answer = m.groups()  # SGLang keeps the newline before </think>

    resp = _chat(pserver, **body)
    message = resp["choices"][0]["message"]
    assert message == {
        "role": "assistant",
        "content": answer,
        "reasoning_content": reasoning,
        "tool_calls": None,
    }
    assert resp["usage"]["reasoning_tokens"] == 0  # SGLang 0.5.4 never fills it

    streamed = _collect(_stream(pserver, **body))
    assert (streamed["reasoning"], streamed["content"]) == (reasoning, answer)
    assert streamed["finish"][0] == "stop"
    # stream_reasoning false: the reasoning arrives in one chunk.
    events = _stream(pserver, **body, stream_reasoning=False)
    pieces = [e["choices"][0]["delta"]["reasoning_content"] for e in events]
    assert [p for p in pieces if p] == [reasoning]


def test_enable_thinking_forces_reasoning(pserver: ServerHandle) -> None:
    """qwen3: without `<think>` in the reply, only chat_template_kwargs enable_thinking
    makes the text before `</think>` reasoning (as in SGLang)."""
    body = {"regex": r"[a-z]{1,8}</think>[a-z]{1,8}"}
    plain = _chat(pserver, **body)["choices"][0]["message"]
    assert plain["reasoning_content"] is None
    reasoning, answer = plain["content"].split("</think>")
    kwargs = {"chat_template_kwargs": {"enable_thinking": True}}
    message = _chat(pserver, **body, **kwargs)["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == (reasoning, answer)
    streamed = _collect(_stream(pserver, **body, **kwargs))
    assert (streamed["reasoning"], streamed["content"]) == (reasoning, answer)


def test_parser_endpoints(pserver: ServerHandle) -> None:
    r = pserver.post(
        "/separate_reasoning",
        json={"text": "<think>\nhmm\n</think>\n\nYes.", "reasoning_parser": "deepseek-r1"},
    )
    assert r.status_code == 200 and r.json() == {"reasoning_text": "hmm\n", "text": "Yes."}
    text = 'Ok <|python_tag|>{"name": "add", "parameters": {"a": 1}}'
    r = pserver.post(
        "/parse_function_call", json={"text": text, "tools": [ADD], "tool_call_parser": "llama3"}
    )
    assert r.status_code == 200
    assert r.json() == {
        "normal_text": "Ok ",
        "calls": [{"tool_index": -1, "name": "add", "parameters": '{"a": 1}'}],
    }
    for path, body in [
        ("/separate_reasoning", {"text": "x", "reasoning_parser": "nope"}),
        ("/parse_function_call", {"text": "x", "tools": [ADD], "tool_call_parser": "nope"}),
    ]:
        r = pserver.post(path, json=body)
        assert r.status_code == 400 and list(r.json()) == ["error"], r.text


def test_bad_tool_requests(pserver: ServerHandle) -> None:
    client = openai.OpenAI(base_url=f"{pserver.base_url}/v1", api_key="x", max_retries=0)
    bad_schema = {"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}
    cases = [
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
         "Tool 'x' not found in tools list."),
        ({"tool_choice": "required"}, "Tools cannot be empty if tool choice is set to required."),
        ({"tool_choice": WEATHER_CHOICE},
         "Tools cannot be empty if tool choice is set to a specific tool."),
        ({"tools": [bad_schema]}, "Tool 0 function has invalid 'parameters' schema: "),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, None),
    ]  # fmt: skip
    for extra, message in cases:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(**{**BASE, **extra})
        body = info.value.response.json()
        assert list(body) == ["object", "message", "type", "param", "code"], body
        assert body["code"] == 400
        if message:
            assert body["message"].startswith(message), body
    assert requests.get(f"{pserver.base_url}/health", timeout=30).status_code == 200


def test_tool_parameters_checked_as_json_schema(pserver: ServerHandle) -> None:
    """SGLang checks every tool's `parameters` against Draft 2020-12 whatever the
    tool_choice: 400 "Tool 0 function has invalid 'parameters' schema: <SchemaError>"."""
    schema = {"type": "unknown_type", "properties": {"a": {"type": "integer"}}}
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    with pytest.raises(SchemaError) as expected:
        Draft202012Validator.check_schema(schema)
    message = f"Tool 0 function has invalid 'parameters' schema: {expected.value}"
    for choice in ("auto", "required", "none", {"type": "function", "function": {"name": "f"}}):
        r = requests.post(
            f"{pserver.base_url}/v1/chat/completions",
            json={**BASE, "tools": [tool], "tool_choice": choice},
            timeout=60,
        )
        assert r.status_code == 400, (choice, r.text)
        assert r.json() == {
            "object": "error",
            "message": message,
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }


def test_reasoning_then_tool_call(pserver: ServerHandle) -> None:
    """A think block followed by a call: reasoning_content, no content, tool_calls."""
    regex = r"<think>\n[a-z]{1,8}\n</think>\n\n" + QWEN_CALL_REGEX.split(r"\.\n", 1)[1]
    body = {"tools": [WEATHER], "regex": regex}
    (choice,) = _chat(pserver, **body)["choices"]
    message = choice["message"]
    assert re.fullmatch(r"[a-z]{1,8}\n", message["reasoning_content"]), message
    assert message["content"] is None and choice["finish_reason"] == "tool_calls"
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    _check_weather_args(call["function"]["arguments"])
    streamed = _collect(_stream(pserver, **body))
    assert streamed["reasoning"] == message["reasoning_content"] and streamed["content"] == ""
    assert streamed["calls"] == {0: ["get_weather", call["function"]["arguments"]]}
    assert streamed["finish"][0] == "tool_calls"


@pytest.fixture(scope="module")
def no_parser_server(compact_json_server: ServerHandle) -> ServerHandle:
    # compact JSON, as pserver, so the random model's constrained reply ends within max_tokens
    return compact_json_server


def test_tools_without_a_parser_reply_as_text(no_parser_server: ServerHandle) -> None:
    """Without --tool-call-parser SGLang still takes tools: the template renders them and the
    reply is plain content. A named tool_choice still constrains it to the JSON array of
    calls, which stays text: no tool_calls, finish_reason "stop"."""
    server = no_parser_server
    plain = _chat(server, max_tokens=4)
    with_tools = _chat(server, tools=[WEATHER], max_tokens=4)
    assert with_tools["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"]
    message = with_tools["choices"][0]["message"]
    assert message["tool_calls"] is None and isinstance(message["content"], str)
    forced = _chat(server, tools=[WEATHER], tool_choice=WEATHER_CHOICE, max_tokens=200)
    (choice,) = forced["choices"]
    assert choice["message"]["tool_calls"] is None
    assert choice["finish_reason"] == "stop", choice
    (call,) = json.loads(choice["message"]["content"])
    assert call["name"] == "get_weather"
    _check_weather_args(json.dumps(call["parameters"]))

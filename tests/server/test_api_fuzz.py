"""Seeded API fuzzing: bad input never hurts the server.

One module server on the tiny random Llama (with --reasoning-parser / --tool-call-parser, so
the chat parsers are on the path) gets a few hundred generated malformed or edge-case
requests across its endpoints, built from valid base bodies by seeded mutations: a field
set to a wrong-typed / empty / huge / negative / NaN / control-character / lone-surrogate
value, a required field dropped, or the whole body replaced (not JSON, not an object,
invalid UTF-8, wrong Content-Type). The contract checked for every request:

- the status is 2xx or 4xx (never 5xx; the one exception is SGLang 0.5.4's own documented
  500 for /stop_profile without a running profile, which no fuzz case reaches);
- a 4xx body is an SGLang error envelope with a non-empty message that is not a raw Python
  exception text (it must say what to fix);
- a 200 stream is framed as SSE and ends with `data: [DONE]`; an error inside it is an
  `{"error": {"message": ...}}` event;
- after every batch /health is 200; at the end no KV or request slot is held, the scheduler's
  memory check never failed, and a greedy request returns the same ids as before.

Cases are deterministic (SEED); a failure message lists every violating case so that one
run shows all bugs. Pause / profile endpoints are fuzzed only with state restored after.
"""

from __future__ import annotations

import copy
import json
import os
import random
import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.server.conftest import EOS_PROMPT, ServerHandle, TinyModel, launch_server, parse_sse

# FUZZ_SEED / FUZZ_CASES explore further (e.g. before a release); the suite uses the default.
SEED = int(os.environ.get("FUZZ_SEED", "20261126"))
NUM_CASES = int(os.environ.get("FUZZ_CASES", "360"))
BATCH = 24
WORKERS = 4
REQUEST_TIMEOUT_S = 60

# Values a mutation may put into any field.
HUGE_STR = "x" * 20000
BAD_VALUES: list[Any] = [
    None, "", " ", [], {}, 0, -1, 1, 2, -(2**31), 2**31, 2**63, 10**30, -(10**30), 0.5, -0.5,
    1e308, -1e308, float("nan"), float("inf"), float("-inf"), "NaN", "inf", "-Infinity", True,
    False, HUGE_STR, "\x00\x01\x1b[31m\u200b", "\ud800", "\U0001f642" * 50, [1, "a", None],
    [[1, 2], [3]], [[]], {"a": {"b": []}}, [-1], [10**9], ["a", "b"], [{}], "[unclosed(",
    '{"type": "nonsense"}', "root ::= ", "]]]", "999999999999999999999",
]  # fmt: skip

# Python / library exception text that must never be the whole story of a 4xx message.
RAW_EXCEPTION = re.compile(
    r"not supported between instances|object has no attribute|NoneType|unhashable type|"
    r"positional argument|object is not (iterable|subscriptable|callable)|"
    r"can't multiply|unsupported operand|invalid literal for int|list index out of range|"
    r"Traceback|KeyError|IndexError|RuntimeError|AssertionError"
)

PROFILE_DIR = "/tmp/mini_sglang_fuzz_profiles"
GREEDY = {"temperature": 0, "max_new_tokens": 3}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 4}},
            "required": ["city"],
        },
    },
}
MSGS = [{"role": "user", "content": "Hi"}]

# Base bodies per route: each is valid (or nearly) before mutation, and cheap to serve.
BASES: dict[str, list[dict]] = {
    "/generate": [
        {"text": "Hello", "sampling_params": dict(GREEDY)},
        {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2, "top_k": 5}},
        {"text": ["a", "b"], "sampling_params": [dict(GREEDY), dict(GREEDY)]},
        {"input_ids": [[5, 6], [7]], "sampling_params": dict(GREEDY), "rid": ["f1", "f2"]},
        {"text": "Hi", "sampling_params": {**GREEDY, "n": 2, "temperature": 0.7}},
        {
            "text": "Hi",
            "return_logprob": True,
            "logprob_start_len": 0,
            "top_logprobs_num": 2,
            "token_ids_logprob": [1, 2],
            "sampling_params": dict(GREEDY),
        },
        {"text": "Hi", "sampling_params": {**GREEDY, "regex": "(yes|no)"}},
        {"text": "Hi", "sampling_params": {**GREEDY, "json_schema": '{"type": "integer"}'}},
        {"text": "Hi", "sampling_params": {**GREEDY, "ebnf": 'root ::= "a" | "b"'}},
        {"text": "Hi", "sampling_params": {**GREEDY, "stop": ["x"], "stop_token_ids": [3]}},
        {"text": "Hi", "sampling_params": {**GREEDY, "logit_bias": {"5": 2.0}}},
        {"text": "Hi", "sampling_params": {**GREEDY, "stop_regex": "a+b", "min_new_tokens": 1}},
    ],
    "/v1/completions": [
        {"model": "m", "prompt": "Hello", "max_tokens": 3, "temperature": 0},
        {"model": "m", "prompt": [1, 2, 3], "max_tokens": 2, "logprobs": 2, "echo": True},
        {"model": "m", "prompt": ["a", "b"], "max_tokens": 2, "n": 2, "seed": 3},
        {
            "model": "m",
            "prompt": "Hi",
            "max_tokens": 3,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
        },
        {"model": "m", "prompt": "Hi", "max_tokens": 2, "logit_bias": {"7": -5}, "stop": "a"},
    ],
    "/v1/chat/completions": [
        {"model": "m", "messages": MSGS, "max_tokens": 3, "temperature": 0},
        {"model": "m", "messages": MSGS, "max_tokens": 3, "logprobs": True, "top_logprobs": 2},
        {"model": "m", "messages": MSGS, "max_tokens": 8, "tools": [TOOL]},
        {
            "model": "m",
            "messages": MSGS,
            "max_tokens": 8,
            "tools": [TOOL],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        },
        {
            "model": "m",
            "messages": MSGS,
            "max_tokens": 3,
            "response_format": {"type": "json_object"},
        },
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c1", "function": {"name": "get_weather", "arguments": "{}"}}
                    ],
                },
                {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
            ],
            "max_tokens": 3,
            "chat_template_kwargs": {"enable_thinking": False},
            "separate_reasoning": True,
        },
        {"model": "m", "messages": MSGS, "max_completion_tokens": 3, "n": 2, "seed": 1},
    ],
    "/tokenize": [{"prompt": "Hello world"}, {"prompt": ["a", "b"], "add_special_tokens": False}],
    "/detokenize": [{"tokens": [1, 2, 3]}, {"tokens": [[1], [2, 3]]}],
    "/separate_reasoning": [{"text": "<think>a</think>b", "reasoning_parser": "qwen3"}],
    "/parse_function_call": [
        {
            "text": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "a"}}\n</tool_call>',
            "tools": [TOOL],
            "tool_call_parser": "qwen25",
        }
    ],
    "/abort_request": [{"rid": "no-such-request"}, {"rid": "", "abort_all": False}],
    "/get_weights_by_name": [{"name": "model.norm.weight", "truncate_size": 3}],
    "/update_weights_from_disk": [{"model_path": "/nonexistent/model"}],
    "/update_weights_from_distributed": [
        {"names": ["model.norm.weight"], "dtypes": ["float32"], "shapes": [[64]]}
    ],
    "/destroy_weights_update_group": [{"group_name": "no_such_group"}],
    "/start_profile": [{"output_dir": "/tmp/mini_sglang_fuzz_profiles", "num_steps": "x"}],
}
# Streaming variants are cases of their own on the generation routes.
STREAMABLE = {"/generate", "/v1/completions", "/v1/chat/completions"}
# Routes whose body FastAPI parses (pydantic models), as SGLang's do.
FASTAPI_PARSED = {
    "/v1/completions",
    "/v1/chat/completions",
    "/tokenize",
    "/detokenize",
    "/separate_reasoning",
    "/parse_function_call",
}
OPENAI_ROUTES = {"/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"}


@dataclass
class Case:
    index: int
    path: str
    body: bytes
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})
    label: str = ""

    def describe(self) -> str:
        return f"#{self.index} POST {self.path} [{self.label}] {self.body[:300]!r}"


# ---- generation of cases -----------------------------------------------------------------
def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key / index path into `obj` (so nested fields get mutated too)."""
    out: list[tuple] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.append((*prefix, k))
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:3]):
            out.append((*prefix, i))
            out += _paths(v, (*prefix, i))
    return out


def _set(obj: Any, path: tuple, value: Any, delete: bool) -> None:
    for key in path[:-1]:
        obj = obj[key]
    if delete:
        del obj[path[-1]]
    else:
        obj[path[-1]] = value


# Field names worth injecting even when no base body has them.
EXTRA_FIELDS = {
    "/generate": [
        "return_logprob", "logprob_start_len", "top_logprobs_num", "token_ids_logprob",
        "return_text_in_logprobs", "stream", "rid", "input_embeds", "image_data",
        "return_hidden_states", "session_params", "lora_path", "data_parallel_rank",
        "priority", "custom_logit_processor", "log_metrics",
    ],
    "/v1/completions": [
        "logprobs", "echo", "n", "best_of", "suffix", "stream_options", "top_k", "min_p",
        "min_tokens", "regex", "ebnf", "json_schema", "stop_token_ids", "rid", "user",
        "presence_penalty", "repetition_penalty", "stop_regex", "skip_special_tokens",
    ],
    "/v1/chat/completions": [
        "tools", "tool_choice", "top_logprobs", "logprobs", "response_format", "stream_options",
        "chat_template_kwargs", "reasoning_effort", "continue_final_message", "stop",
        "separate_reasoning", "stream_reasoning", "logit_bias", "rid", "top_k", "regex",
    ],
}  # fmt: skip
SAMPLING_FIELDS = [
    "max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "n", "stop",
    "stop_token_ids", "stop_regex", "regex", "json_schema", "ebnf", "logit_bias",
    "sampling_seed", "stream_interval", "ignore_eos", "skip_special_tokens", "no_stop_trim",
    "custom_params", "spaces_between_special_tokens",
]  # fmt: skip
BAD_MESSAGES: list[Any] = [
    [], [{}], [{"role": "user"}], [{"role": "robot", "content": "x"}],
    [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
    [{"role": "user", "content": [{"type": "text"}]}], [{"role": "tool", "content": "x"}],
    [{"role": "assistant", "content": "x"}], "Hi", [{"role": "user", "content": HUGE_STR}],
    [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]}],
    [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}],
    [{"role": "user", "content": "\ud800"}],
]  # fmt: skip
BAD_TOOLS: list[Any] = [
    [{"type": "function"}], [{"function": {"name": 3}}], [{"function": {"parameters": {}}}],
    [{"function": {"name": "f", "parameters": {"type": "nonsense"}}}],
    [{"function": {"name": "f", "parameters": {"type": "object", "properties": 5}}}],
    [{"function": {"name": "f", "parameters": {"$ref": "#/nowhere"}}}],
    [{"function": {"name": "f", "parameters": "not a schema"}}], [TOOL, TOOL],
    [{"type": "retrieval", "function": {"name": "f"}}],
]  # fmt: skip
BAD_TOOL_CHOICE: list[Any] = [
    "required", "auto", "none", "sometimes", {"type": "function"},
    {"type": "function", "function": {"name": "missing_fn"}}, {"function": {}}, 5,
]  # fmt: skip


def bad_value(rng: random.Random) -> Any:
    """A fresh copy of a random BAD_VALUES entry (shared objects could nest into cycles)."""
    return copy.deepcopy(rng.choice(BAD_VALUES))


def _mutated_body(rng: random.Random, path: str) -> tuple[Any, str]:
    body = json.loads(json.dumps(rng.choice(BASES[path])))
    labels = []
    for _ in range(rng.choice([1, 1, 2])):
        roll = rng.random()
        if path == "/v1/chat/completions" and roll < 0.12:
            body["messages"] = rng.choice(BAD_MESSAGES)
            labels.append("messages")
            continue
        if path == "/v1/chat/completions" and roll < 0.24:
            body["tools"] = rng.choice(BAD_TOOLS)
            if rng.random() < 0.5:
                body["tool_choice"] = rng.choice(BAD_TOOL_CHOICE)
            labels.append("tools")
            continue
        if path == "/generate" and roll < 0.35:
            sp = body.setdefault("sampling_params", {})
            target = sp[0] if isinstance(sp, list) and sp else sp
            key = rng.choice(SAMPLING_FIELDS)
            if isinstance(target, dict):
                target[key] = bad_value(rng)
            labels.append(f"sampling_params.{key}")
            continue
        if roll < 0.55 and path in EXTRA_FIELDS:
            key = rng.choice(EXTRA_FIELDS[path])
            body[key] = bad_value(rng)
            labels.append(key)
            continue
        paths = _paths(body)
        if not paths:
            continue
        target_path = rng.choice(paths)
        delete = rng.random() < 0.2 and isinstance(target_path[-1], str)
        _set(body, target_path, bad_value(rng), delete)
        labels.append(("del " if delete else "") + ".".join(map(str, target_path)))
    if path == "/start_profile" and isinstance(body.get("output_dir"), str):
        # A profile that really starts writes its trace there: never into the repository.
        body["output_dir"] = PROFILE_DIR
    if path in STREAMABLE and rng.random() < 0.35:
        body["stream"] = True
        if path != "/generate" and rng.random() < 0.5:
            body["stream_options"] = {"include_usage": rng.choice([True, False, None])}
        labels.append("stream")
    return body, ",".join(labels)


def _whole_body(rng: random.Random) -> tuple[bytes, dict[str, str], str]:
    json_ct = {"Content-Type": "application/json"}
    return rng.choice(
        [
            (b"", json_ct, "empty body"),
            (b"{", json_ct, "truncated json"),
            (b"not json at all", json_ct, "not json"),
            (b"[1, 2, 3]", json_ct, "json array"),
            (b'"text"', json_ct, "json string"),
            (b"null", json_ct, "json null"),
            (b"42", json_ct, "json number"),
            (b'{"text": "\xff\xfe\xfa"}', json_ct, "invalid utf-8"),
            (b'{"text": NaN, "prompt": Infinity}', json_ct, "NaN literal"),
            (b'{"text": "hi"}', {"Content-Type": "text/plain"}, "text/plain"),
            (b'{"text": "hi"}', {}, "no content-type"),
            (b"text=hi", {"Content-Type": "application/x-www-form-urlencoded"}, "form"),
            (b'{"a":' * 2000, json_ct, "deep nesting"),
        ]
    )


def build_cases(seed: int, count: int) -> list[Case]:
    """`count` deterministic fuzz cases (same seed -> same bytes)."""
    rng = random.Random(seed)
    routes = list(BASES)
    # Generation routes carry most of the logic, so they get most of the cases.
    weights = [6 if r in STREAMABLE else 1 for r in routes]
    cases = []
    for i in range(count):
        path = rng.choices(routes, weights)[0]
        if rng.random() < 0.12:
            body, headers, label = _whole_body(rng)
            cases.append(Case(i, path, body, headers, label))
            continue
        obj, label = _mutated_body(rng, path)
        # json.dumps writes NaN / Infinity literals and "\ud800" escapes on purpose.
        cases.append(Case(i, path, json.dumps(obj).encode(), label=label))
    return cases


# ---- checking ------------------------------------------------------------------------------
def _error_message(path: str, payload: Any) -> str | None:
    """The message of an SGLang error envelope for `path`, or None if it is not one."""
    if not isinstance(payload, dict):
        return None
    if path.startswith(("/update_weights", "/destroy_weights", "/init_weights")):
        # A refused weight update is SGLang's {"success": false, "message", ...} with 400.
        if payload.get("success") is False and "message" in payload:
            return payload["message"]
    if list(payload) == ["detail"] and path in FASTAPI_PARSED:
        # FastAPI's own 400 for a body json.loads cannot parse at all (e.g. nested past the
        # recursion limit), exactly what SGLang's FastAPI answers too.
        return payload["detail"]
    native = payload.get("error")
    if list(payload) == ["error"] and isinstance(native, dict):
        return native.get("message")
    # OpenAI's envelope (also SGLang's 400 for a body that fails validation, on any route).
    keys = ["object", "message", "type", "param", "code"]
    if list(payload) == keys and payload["object"] == "error":
        return payload["message"]
    return None


def check_response(case: Case, r: requests.Response) -> list[str]:
    """Every contract violation of one response (empty if it is fine)."""
    problems = []
    where = case.describe()
    if r.status_code >= 500:
        return [f"{where}: HTTP {r.status_code}: {r.text[:300]}"]
    if not (200 <= r.status_code < 300 or 400 <= r.status_code < 500):
        return [f"{where}: unexpected HTTP {r.status_code}"]
    if r.status_code >= 400:
        try:
            payload = r.json()
        except ValueError:
            return [f"{where}: {r.status_code} body is not JSON: {r.text[:200]!r}"]
        message = _error_message(case.path, payload)
        if not isinstance(message, str) or not message.strip():
            problems.append(f"{where}: {r.status_code} body is no error envelope: {payload}")
        elif RAW_EXCEPTION.search(message):
            problems.append(f"{where}: {r.status_code} message is a raw exception: {message!r}")
        elif case.path in OPENAI_ROUTES and payload.get("code") not in (None, r.status_code):
            problems.append(f"{where}: code {payload.get('code')} != HTTP {r.status_code}")
        return problems
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        try:
            events = parse_sse(r.content)
        except (AssertionError, ValueError) as e:
            return [f"{where}: broken SSE stream ({e}): {r.content[-300:]!r}"]
        for ev in events:
            if isinstance(ev, dict) and "error" in ev:
                msg = (ev["error"] or {}).get("message")
                if not isinstance(msg, str) or not msg.strip():
                    problems.append(f"{where}: stream error event without message: {ev}")
                elif RAW_EXCEPTION.search(msg):
                    problems.append(f"{where}: stream error is a raw exception: {msg!r}")
    return problems


_PROFILE_LOCK = threading.Lock()


def send(server: ServerHandle, case: Case) -> list[str]:
    """Send one case and check the reply. A /start_profile case that really started a
    profile stops it at once (under a lock, so two never overlap: SGLang answers a second
    start with its own 500)."""
    if case.path == "/start_profile":
        with _PROFILE_LOCK:
            problems = _send(server, case)
            try:
                requests.post(server.base_url + "/stop_profile", timeout=REQUEST_TIMEOUT_S)
            except requests.RequestException as e:
                problems.append(f"{case.describe()}: /stop_profile after it failed: {e}")
            return problems
    return _send(server, case)


def _send(server: ServerHandle, case: Case) -> list[str]:
    try:
        r = requests.post(
            server.base_url + case.path,
            data=case.body,
            headers=case.headers,
            timeout=REQUEST_TIMEOUT_S,
        )
    except requests.RequestException as e:
        return [f"{case.describe()}: request failed: {e}"]
    return check_response(case, r)


# ---- the test ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fuzz_server(tiny_model: TinyModel, server_logs: Path) -> Iterator[ServerHandle]:
    handle = launch_server(
        tiny_model.path,
        "--reasoning-parser",
        "qwen3",
        "--tool-call-parser",
        "qwen25",
        log_dir=server_logs,
    )
    yield handle
    handle.stop()


def _greedy_ids(server: ServerHandle) -> list[int]:
    body = {"text": EOS_PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": 6}}
    r = server.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


def test_cases_are_deterministic() -> None:
    a, b = build_cases(SEED, 50), build_cases(SEED, 50)
    assert [(c.path, c.body, c.headers) for c in a] == [(c.path, c.body, c.headers) for c in b]


def test_fuzz_api(fuzz_server: ServerHandle) -> None:
    server = fuzz_server
    before = _greedy_ids(server)
    cases = build_cases(SEED, NUM_CASES)
    problems: list[str] = []
    with ThreadPoolExecutor(WORKERS) as pool:
        for start in range(0, len(cases), BATCH):
            batch = cases[start : start + BATCH]
            for found in pool.map(lambda c: send(server, c), batch):
                problems += found
            if server.proc.poll() is not None:
                pytest.fail(
                    f"server died during cases {start}..{start + len(batch) - 1}:\n"
                    + "\n".join(problems[-10:])
                    + f"\n{server.log_tail(40)}"
                )
            health = server.get("/health", timeout=30)
            if health.status_code != 200:
                problems.append(f"/health {health.status_code} after cases {start}..")
                break
    server.post("/continue_generation")  # no case pauses, but never leave it paused
    assert not problems, f"{len(problems)} violations:\n" + "\n".join(problems[:60])
    m = server.wait_memory_all_free()
    assert m["failures"] == 0, m
    assert _greedy_ids(server) == before


# ---- regressions: each input below once crashed the scheduler or answered badly -----------
SP = {"max_new_tokens": 2, "temperature": 0}
REGRESSIONS: list[tuple[str, Any, int, str]] = [
    # A list group name reached the scheduler's `in groups` check: TypeError, server down.
    (
        "/destroy_weights_update_group",
        {"group_name": [1]},
        400,
        "body.group_name: Input should be a valid string",
    ),
    # A list rid reached the scheduler's rid.startswith(prefix): TypeError, server down.
    ("/abort_request", {"rid": ["a"]}, 400, "body.rid: Input should be a valid string"),
    # Logprob options the scheduler indexes with: nested / out-of-vocab ids, a top-k above
    # the vocab, a non-integer count.
    (
        "/generate",
        {"text": "hi", "return_logprob": True, "token_ids_logprob": [[1, 2], [3]], "sampling_params": SP},
        400,
        "token_ids_logprob must be a list of token ids in [0, ",
    ),
    (
        "/generate",
        {"text": "hi", "return_logprob": True, "token_ids_logprob": [10**7], "sampling_params": SP},
        400,
        "token_ids_logprob must be a list of token ids in [0, ",
    ),
    (
        "/generate",
        {"text": "hi", "return_logprob": True, "top_logprobs_num": 10**9, "sampling_params": SP},
        400,
        "top_logprobs_num must be in [0, ",
    ),
    ("/generate", {"text": "hi", "top_logprobs_num": "x"}, 400, "body.top_logprobs_num"),
    (
        "/generate",
        {"text": "hi", "return_logprob": True, "logprob_start_len": -5, "sampling_params": SP},
        400,
        "logprob_start_len must be -1 or at least 0, got -5.",
    ),
    # A list rid on a single prompt became an unhashable request key.
    (
        "/v1/chat/completions",
        {"model": "m", "messages": MSGS, "max_tokens": 2, "rid": ["a", "b"]},
        400,
        "The rid should be a string for a single request.",
    ),
    # n is expanded into n sub-request objects up front: 2**31 exhausted the memory.
    ("/generate", {"text": "hi", "sampling_params": {"n": 2**31}}, 400, "n must be at most 1024"),
    ("/v1/completions", {"model": "m", "prompt": "hi", "n": 10**9}, 400, "n must be at most 1024"),
    # A lone surrogate made the HF tokenizer raise an opaque TypeError (500 on /tokenize),
    # and failed serialising a response that echoes it (the rid) after generating.
    ("/tokenize", {"prompt": "a\ud800"}, 400, "body: Invalid Unicode: "),
    ("/v1/completions", {"model": "m", "prompt": "\ud800", "max_tokens": 2}, 400, "body: Invalid Unicode: "),
    (
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "\udfff"}], "max_tokens": 2},
        400,
        "body: Invalid Unicode: ",
    ),
    ("/v1/completions", {"model": "m", "prompt": "hi", "stop": ["\ud800"]}, 400, "body: Invalid Unicode: "),
    # An error message quoting a lone surrogate could not be serialised: 500.
    (
        "/separate_reasoning",
        {"text": "a", "reasoning_parser": "\ud800"},
        400,
        "Unsupported model type: \\ud800",
    ),
    ("/v1/chat/completions", {"model": "m", "messages": MSGS, "max_tokens": 1, "rid": "\ud800"}, 400, "Invalid Unicode"),
    # A list logprob option on a single prompt reached an int comparison: TypeError.
    (
        "/generate",
        {"text": "hi", "return_logprob": True, "top_logprobs_num": [3], "sampling_params": SP},
        400,
        "top_logprobs_num should be a single value for a single request.",
    ),
]  # fmt: skip


@pytest.mark.parametrize("index", range(len(REGRESSIONS)))
def test_regression_inputs(fuzz_server: ServerHandle, index: int) -> None:
    path, body, status, message = REGRESSIONS[index]
    r = fuzz_server.post(path, json=body)
    assert r.status_code == status, r.text
    case = Case(-1, path, json.dumps(body).encode(), label="regression")
    assert check_response(case, r) == []
    if status >= 400:
        payload = r.json()
        assert message in (payload.get("message") or payload["error"]["message"]), payload
    assert fuzz_server.get("/health").status_code == 200

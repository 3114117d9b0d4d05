"""Seeded generation of malformed / edge-case API requests for test_api_fuzz.py.

`build_cases(seed, count)` returns `count` Case objects, the same bytes for the same seed.
Each starts from a valid base body of a route (BASES) and gets one or two seeded mutations:
a field (nested ones too) set to a BAD_VALUES entry or dropped, a known field injected with
a bad value, chat messages / tools / tool_choice replaced by broken ones, a streaming
variant; or the whole body is replaced (not JSON, not an object, invalid UTF-8, wrong
Content-Type, nesting past the parser's recursion limit).
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass, field
from typing import Any

# Values a mutation may put into any field.
HUGE_STR = "x" * 20000
BAD_VALUES: list[Any] = [
    None, "", " ", [], {}, 0, -1, 1, 2, -(2**31), 2**31, 2**63, 10**30, -(10**30), 0.5, -0.5,
    1e308, -1e308, float("nan"), float("inf"), float("-inf"), "NaN", "inf", "-Infinity", True,
    False, HUGE_STR, "\x00\x01\x1b[31m\u200b", "\ud800", "\U0001f642" * 50, [1, "a", None],
    [[1, 2], [3]], [[]], {"a": {"b": []}}, [-1], [10**9], ["a", "b"], [{}], "[unclosed(",
    '{"type": "nonsense"}', "root ::= ", "]]]", "999999999999999999999",
]  # fmt: skip

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

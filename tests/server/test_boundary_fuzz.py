"""Property-based boundary fuzz of every numeric request field (hypothesis).

The seeded fuzz (test_api_fuzz.py) mutates one or two fields per case with values from a
long list, so a given (field, edge value) pair is reached only by chance. Here the edges
where parsers and tensor builders break are enumerated: int64's min / max and one past each,
float32's max and ten times it, NaN, +-Infinity, -0.0, 0, a negative, and empty / huge lists.

- Alone: every (field, edge) pair is an explicit example (hypothesis runs them first), so
  none can be missed: /generate's sampling params (temperature, top_p, top_k, min_p, the
  three penalties, min/max_new_tokens, n, stream_interval, sampling_seed, stop_token_ids,
  logit_bias keys and values), its logprob options (top_logprobs_num, logprob_start_len,
  token_ids_logprob) and the empty / huge lists; on /v1/completions and /v1/chat/completions
  the fields their own models parse as integers (top_k, seed, n, max_tokens,
  max_completion_tokens, min_tokens, logprobs, top_logprobs, best_of) and logit_bias and
  stop_token_ids. (The OpenAI float fields are parsed as floats and then checked by the same
  SamplingParams as /generate's, whose grid covers them.)
- Combined: drawn bodies set any subset of every numeric field of the route (the OpenAI
  float fields included), each at an edge or at a valid value, so an edge is often the only
  fault of a request that would otherwise run.

After every case: the status is 2xx or 4xx (never 5xx, never a dropped connection), once
idle every KV slot and request slot is free (the scheduler's memory check never failed),
and the server (conftest's shared `server`) still answers /health_generate. The server has
state, so shrinking is off: a failure reports the first case that broke the contract (with
the server log if it died).
Generation is derandomized, so CI runs the same cases every time.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import pytest
import requests

pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.server.conftest import ServerHandle  # noqa: E402

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
FLOAT32_MAX = 3.4028234663852886e38
EDGES: list[Any] = [
    INT64_MIN - 1,
    INT64_MIN,
    INT64_MAX,
    INT64_MAX + 1,
    FLOAT32_MAX,
    FLOAT32_MAX * 10,
    math.nan,
    math.inf,
    -math.inf,
    -0.0,
    0,
    -1,
]
HUGE = 4096  # entries of a "huge" list or logit_bias map
COMBINED_EXAMPLES = 25  # drawn bodies per route, after the explicit grid
REQUEST_TIMEOUT_S = 60
MSGS = [{"role": "user", "content": "Hi"}]


# ---- the edges, alone --------------------------------------------------------------------
def _bias_key(edge: Any) -> str:
    """A logit_bias key is a JSON string: the edge as a client would spell it."""
    return str(edge)


def generate_grid() -> list[dict[str, Any]]:
    """Every /generate numeric field alone at every edge, and the empty / huge lists."""
    scalars = (
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "min_new_tokens",
        "max_new_tokens",
        "n",
        "stream_interval",
        "sampling_seed",
    )
    grid: list[dict[str, Any]] = []
    for e in EDGES:
        grid += [{"sampling_params": {k: e}} for k in scalars]
        grid += [
            {"sampling_params": {"stop_token_ids": [e]}},
            {"sampling_params": {"logit_bias": {"1": e}}},
            {"sampling_params": {"logit_bias": {_bias_key(e): 1.0}}},
            {"return_logprob": True, "top_logprobs_num": e},
            {"return_logprob": True, "logprob_start_len": e},
            {"return_logprob": True, "token_ids_logprob": [e]},
        ]
    for empty_or_huge in (0, HUGE):
        grid += [
            {"sampling_params": {"stop_token_ids": [1] * empty_or_huge}},
            {"sampling_params": {"stop": ["x"] * empty_or_huge}},
            {"sampling_params": {"logit_bias": {str(i): 1.0 for i in range(empty_or_huge)}}},
            {"return_logprob": True, "token_ids_logprob": [1] * empty_or_huge},
        ]
    return [{"text": "Hi", **case} for case in grid]


def openai_grid(base: dict[str, Any], int_fields: tuple[str, ...]) -> list[dict[str, Any]]:
    """An OpenAI route's integer-parsed fields, logit_bias and stop_token_ids alone at every
    edge (top_logprobs goes with logprobs=true, which enables it)."""
    grid: list[dict[str, Any]] = []
    for e in EDGES:
        grid += [{"logprobs": True, k: e} if k == "top_logprobs" else {k: e} for k in int_fields]
        grid += [
            {"stop_token_ids": [e]},
            {"logit_bias": {"1": e}},
            {"logit_bias": {_bias_key(e): 1.0}},
        ]
    grid += [{"stop": []}, {"stop": ["x"] * HUGE}, {"stop_token_ids": [1] * HUGE}]
    return [{**base, **case} for case in grid]


COMPLETIONS_BASE = {"model": "m", "prompt": "Hi"}
CHAT_BASE = {"model": "m", "messages": MSGS}
COMPLETIONS_INTS = ("top_k", "seed", "n", "max_tokens", "min_tokens", "logprobs", "best_of")
CHAT_INTS = ("top_k", "seed", "n", "max_tokens", "max_completion_tokens", "min_tokens")
CHAT_INTS += ("top_logprobs",)


# ---- the edges, combined -----------------------------------------------------------------
EDGE = st.sampled_from(EDGES)
EDGE_LIST = st.one_of(
    st.just([]), st.lists(EDGE, min_size=1, max_size=3), EDGE.map(lambda v: [v] * HUGE)
)
BIAS_KEY = st.sampled_from([_bias_key(e) for e in EDGES])
LOGIT_BIAS = st.one_of(
    st.dictionaries(BIAS_KEY, EDGE, min_size=1, max_size=3),
    EDGE.map(lambda v: {"1": v}),
    EDGE.map(lambda v: {str(i): v for i in range(HUGE)}),
    st.just({}),
)
STOP = st.sampled_from([[], ["x"] * HUGE, ["\n", "Hi"]])


def combined(fields: dict[str, tuple[st.SearchStrategy, Any]]) -> st.SearchStrategy:
    """Any subset of `fields` ({dotted name: (strategy, a valid value)}), each at an edge
    or at its valid value, as a nested body ("sampling_params.top_p" nests)."""
    optional = {k: st.one_of(st.just(valid), s) for k, (s, valid) in fields.items()}

    def nest(flat: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {}
        for key, value in flat.items():
            *parents, leaf = key.split(".")
            node = body
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = value
        return body

    return st.fixed_dictionaries({}, optional=optional).map(nest)


def _edges(valid: dict[str, Any], prefix: str = "") -> dict[str, tuple[st.SearchStrategy, Any]]:
    return {prefix + k: (EDGE, v) for k, v in valid.items()}


SAMPLING_VALID = {
    "temperature": 0.5,
    "top_p": 0.9,
    "top_k": 5,
    "min_p": 0.1,
    "frequency_penalty": 0.5,
    "presence_penalty": 0.5,
    "repetition_penalty": 1.1,
    "min_new_tokens": 1,
    "max_new_tokens": 2,
    "n": 2,
    "stream_interval": 1,
    "sampling_seed": 7,
}
LISTS = {
    "stop_token_ids": (EDGE_LIST, [1]),
    "logit_bias": (LOGIT_BIAS, {"1": 1.0}),
    "stop": (STOP, ["\n"]),
}
GENERATE = combined(
    _edges(SAMPLING_VALID, "sampling_params.")
    | {f"sampling_params.{k}": v for k, v in LISTS.items()}
    | _edges({"top_logprobs_num": 2, "logprob_start_len": 0})
    | {"token_ids_logprob": (EDGE_LIST, [1]), "return_logprob": (st.booleans(), True)}
    | {"stream": (st.booleans(), True)}
).map(lambda body: {"text": "Hi", **body})
OPENAI_VALID = {
    "temperature": 0.5,
    "top_p": 0.9,
    "top_k": 5,
    "min_p": 0.1,
    "frequency_penalty": 0.5,
    "presence_penalty": 0.5,
    "repetition_penalty": 1.1,
    "seed": 7,
    "n": 2,
    "max_tokens": 2,
    "min_tokens": 1,
}
OPENAI = _edges(OPENAI_VALID) | LISTS | {"stream": (st.booleans(), True)}
COMPLETIONS = combined(OPENAI | _edges({"logprobs": 2, "best_of": 1})).map(
    lambda body: {**COMPLETIONS_BASE, **body}
)
CHAT = combined(
    OPENAI
    | _edges({"top_logprobs": 2, "max_completion_tokens": 2})
    | {"logprobs": (st.booleans(), True)}
).map(lambda body: {**CHAT_BASE, **body})


# ---- running a case ----------------------------------------------------------------------
def _short(route: str, body: dict[str, Any]) -> dict[str, Any]:
    """Two new tokens where the case leaves the length out, so cases stay cheap. Chat uses
    `max_tokens or max_completion_tokens` (SGLang), so both default: a falsy edge in one
    (0, -0.0: "no limit") falls back to the other instead of running to the context end."""
    body = json.loads(json.dumps(body))  # a copy: explicit examples are reused objects
    if route == "/generate":
        body.setdefault("sampling_params", {}).setdefault("max_new_tokens", 2)
    elif route == "/v1/completions":
        body.setdefault("max_tokens", 2)
    else:
        body.setdefault("max_tokens", 2)
        body.setdefault("max_completion_tokens", 2)
    return body


def _describe(route: str, body: dict[str, Any]) -> str:
    def squeeze(v: Any) -> Any:
        if isinstance(v, list) and len(v) > 4:
            return f"[{squeeze(v[0])!r}] * {len(v)}"
        if isinstance(v, dict) and len(v) > 4:
            return f"{{{len(v)} keys, first {next(iter(v.items()))!r}}}"
        if isinstance(v, dict):
            return {k: squeeze(x) for k, x in v.items()}
        return v

    return f"POST {route} {squeeze(body)}"


def check_case(server: ServerHandle, route: str, body: dict[str, Any]) -> None:
    """Send one case (Python's json, so NaN / Infinity are the literals Python's and SGLang's
    clients write) and assert the contract; the first violation fails the test."""
    body = _short(route, body)
    where = _describe(route, body)
    try:
        r = requests.post(
            server.base_url + route,
            data=json.dumps(body),
            headers={"Content-Type": "application/json"},
            timeout=REQUEST_TIMEOUT_S,
        )
    except requests.RequestException as e:
        pytest.fail(f"{where}: no reply ({e}):\n{server.log_tail(40)}")
    if server.proc.poll() is not None:
        pytest.fail(f"{where}: the server died:\n{server.log_tail(40)}")
    assert 200 <= r.status_code < 300 or 400 <= r.status_code < 500, (
        f"{where}: HTTP {r.status_code}: {r.text[:300]}"
    )
    try:
        m = server.wait_memory_all_free(timeout=20)
    except (AssertionError, requests.RequestException) as e:
        pytest.fail(f"after {where}: {e}\n{server.log_tail(40)}")
    assert m["failures"] == 0, f"after {where}: memory check failed: {m}"
    health = server.get("/health_generate", timeout=30)
    assert health.status_code == 200, f"after {where}: /health_generate {health.status_code}"


FUZZ_SETTINGS = settings(
    max_examples=COMBINED_EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    phases=(Phase.explicit, Phase.generate),  # no shrinking: the server has state
    suppress_health_check=list(HealthCheck),
    report_multiple_bugs=False,
)


def with_examples(cases: list[dict[str, Any]]) -> Callable:
    """Decorate a @given(body=...) test with every case as an explicit example."""

    def decorate(test: Callable) -> Callable:
        for case in reversed(cases):
            test = example(body=case)(test)
        return test

    return decorate


@FUZZ_SETTINGS
@with_examples(generate_grid())
@given(body=GENERATE)
def test_generate_numeric_edges(server: ServerHandle, body: dict[str, Any]) -> None:
    check_case(server, "/generate", body)


@FUZZ_SETTINGS
@with_examples(openai_grid(COMPLETIONS_BASE, COMPLETIONS_INTS))
@given(body=COMPLETIONS)
def test_completions_numeric_edges(server: ServerHandle, body: dict[str, Any]) -> None:
    check_case(server, "/v1/completions", body)


@FUZZ_SETTINGS
@with_examples(openai_grid(CHAT_BASE, CHAT_INTS))
@given(body=CHAT)
def test_chat_numeric_edges(server: ServerHandle, body: dict[str, Any]) -> None:
    check_case(server, "/v1/chat/completions", body)

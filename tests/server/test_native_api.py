"""SGLang's native HTTP API on the real multi-process server (tiny random Llama, CPU).

Checks what clients see: exact JSON bytes and key order of /generate, exact SSE framing,
batches, concurrency, abort and disconnect (with KV accounting), error envelopes and the
info / health / cache endpoints. One shared server (conftest `server`) serves every test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.server.conftest import EOS_PROMPT, ServerHandle, TinyModel, parse_sse

META_KEYS = [
    "id",
    "finish_reason",
    "prompt_tokens",
    "weight_version",
    "completion_tokens",
    "cached_tokens",
    "e2e_latency",
]


def compact(obj: Any) -> bytes:
    """orjson-style compact one-line JSON (non-ASCII kept as UTF-8)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def generate(server: ServerHandle, body: dict, **kw: Any) -> requests.Response:
    return server.post("/generate", json=body, **kw)


def greedy(max_new_tokens: int, **extra: Any) -> dict:
    return {"temperature": 0, "max_new_tokens": max_new_tokens, **extra}


def stream_events(server: ServerHandle, body: dict) -> list[dict]:
    r = generate(server, {**body, "stream": True})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    return parse_sse(r.content)


# ---- non-stream exact bytes -------------------------------------------------------------
def test_generate_exact_bytes_length(server: ServerHandle, tiny_model: TinyModel, tokenizer):
    r = generate(server, {"text": EOS_PROMPT, "sampling_params": greedy(6, ignore_eos=True)})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    body = r.content
    assert b"\n" not in body
    out = json.loads(body)
    assert list(out) == ["text", "output_ids", "meta_info"]
    meta = out["meta_info"]
    assert list(meta) == META_KEYS
    ids = tiny_model.greedy_ids[:6]
    expected = {
        "text": tokenizer.decode(ids),
        "output_ids": ids,
        "meta_info": {
            "id": meta["id"],
            "finish_reason": {"type": "length", "length": 6},
            "prompt_tokens": len(tiny_model.eos_prompt_ids),
            "weight_version": "default",
            "completion_tokens": 6,
            "cached_tokens": meta["cached_tokens"],
            "e2e_latency": meta["e2e_latency"],
        },
    }
    assert body == compact(expected)
    assert isinstance(meta["id"], str) and len(meta["id"]) == 32  # uuid4().hex
    assert 0 <= meta["cached_tokens"] < len(tiny_model.eos_prompt_ids)
    assert isinstance(meta["e2e_latency"], float) and meta["e2e_latency"] > 0


def test_generate_eos_stop_trims_eos_text(server: ServerHandle, tiny_model: TinyModel, tokenizer):
    r = generate(server, {"text": EOS_PROMPT, "sampling_params": greedy(10), "rid": "eos-1"})
    assert r.status_code == 200
    out = r.json()
    n = tiny_model.eos_index + 1
    # The EOS token is counted and returned in output_ids, but its text is trimmed.
    assert out["output_ids"] == tiny_model.greedy_ids[:n]
    assert out["text"] == tokenizer.decode(tiny_model.greedy_ids[: n - 1])
    meta = out["meta_info"]
    assert meta["id"] == "eos-1"
    assert meta["finish_reason"] == {"type": "stop", "matched": tiny_model.eos_token_id}
    assert r.content.count(
        b'"finish_reason":{"type":"stop","matched":%d}' % tiny_model.eos_token_id
    )
    assert meta["completion_tokens"] == n


def test_generate_stop_string(server: ServerHandle, tokenizer):
    prompt = "Once upon a time"
    full = generate(server, {"text": prompt, "sampling_params": greedy(12, ignore_eos=True)}).json()
    ids = full["output_ids"]
    # A stop string: the text of a generated token that did not occur earlier in the text.
    stop, k = None, 0
    for k in range(2, len(ids)):
        piece = tokenizer.decode([ids[k]])
        before = tokenizer.decode(ids[:k])
        if piece.strip() and piece not in before and "\ufffd" not in piece:
            stop = piece
            break
    assert stop is not None, full
    r = generate(
        server, {"text": prompt, "sampling_params": greedy(12, ignore_eos=True, stop=stop)}
    )
    out = r.json()
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["text"] == full["text"][: full["text"].index(stop)]
    assert out["output_ids"] == ids[: k + 1]
    assert out["meta_info"]["completion_tokens"] == k + 1
    assert b"\n" not in r.content


# ---- streaming --------------------------------------------------------------------------
def test_stream_framing_and_equivalence(server: ServerHandle, tiny_model: TinyModel):
    body = {"text": EOS_PROMPT, "sampling_params": greedy(8, ignore_eos=True)}
    whole = generate(server, body).json()
    events = stream_events(server, body)
    assert len(events) >= 2
    ids: list[int] = []
    for i, ev in enumerate(events):
        last = i == len(events) - 1
        assert list(ev) == ["text", "output_ids", "meta_info"]
        meta = ev["meta_info"]
        assert list(meta) == (META_KEYS if last else META_KEYS[:-1])
        ids += ev["output_ids"]  # 0.5.4: each event carries only the new ids
        assert meta["completion_tokens"] == len(ids)
        if last:
            assert meta["finish_reason"] == {"type": "length", "length": 8}
        else:
            assert meta["finish_reason"] is None
        if i:  # text is cumulative
            assert ev["text"].startswith(events[i - 1]["text"].rstrip("\ufffd"))
    assert ids == whole["output_ids"] == tiny_model.greedy_ids[:8]
    assert events[-1]["text"] == whole["text"]
    assert len({ev["meta_info"]["id"] for ev in events}) == 1


def test_stream_eos_finish(server: ServerHandle, tiny_model: TinyModel):
    events = stream_events(server, {"text": EOS_PROMPT, "sampling_params": greedy(10)})
    ids = [t for ev in events for t in ev["output_ids"]]
    assert ids == tiny_model.greedy_ids[: tiny_model.eos_index + 1]
    fin = events[-1]["meta_info"]["finish_reason"]
    assert fin == {"type": "stop", "matched": tiny_model.eos_token_id}


# ---- batches ----------------------------------------------------------------------------
BATCH_PROMPTS = ["Hello world, this is", "a b c d e f g", "The weather today"]


def test_batch_non_stream_in_order(server: ServerHandle):
    singles = [
        generate(server, {"text": p, "sampling_params": greedy(5, ignore_eos=True)}).json()
        for p in BATCH_PROMPTS
    ]
    r = generate(server, {"text": BATCH_PROMPTS, "sampling_params": greedy(5, ignore_eos=True)})
    assert r.status_code == 200
    assert b"\n" not in r.content
    outs = r.json()
    assert isinstance(outs, list) and len(outs) == len(BATCH_PROMPTS)
    for single, out in zip(singles, outs):
        assert list(out) == ["text", "output_ids", "meta_info"]
        assert out["output_ids"] == single["output_ids"]
        assert out["text"] == single["text"]
        assert list(out["meta_info"]) == META_KEYS
    # rid given as a string is suffixed per sub-request (SGLang).
    outs = generate(
        server, {"text": BATCH_PROMPTS[:2], "rid": "bt", "sampling_params": greedy(2)}
    ).json()
    assert [o["meta_info"]["id"] for o in outs] == ["bt_0", "bt_1"]


def test_batch_stream_has_index(server: ServerHandle):
    body = {"text": BATCH_PROMPTS, "sampling_params": greedy(5, ignore_eos=True)}
    whole = generate(server, body).json()
    events = stream_events(server, body)
    per: dict[int, list[dict]] = {}
    for ev in events:
        assert list(ev) == ["text", "output_ids", "meta_info", "index"]
        per.setdefault(ev["index"], []).append(ev)
    assert sorted(per) == [0, 1, 2]
    for idx, evs in per.items():
        assert [t for e in evs for t in e["output_ids"]] == whole[idx]["output_ids"]
        assert evs[-1]["text"] == whole[idx]["text"]
        assert [e["meta_info"]["finish_reason"] is None for e in evs] == [True] * (len(evs) - 1) + [
            False
        ]


def test_input_ids_unknown_keys_and_defaults(server: ServerHandle, tiny_model: TinyModel):
    # input_ids gives the same result as the text it encodes.
    r = generate(
        server,
        {
            "input_ids": tiny_model.eos_prompt_ids,
            "sampling_params": greedy(4, ignore_eos=True),
            # Unknown top-level keys (sent by newer bench_serving / clients) are ignored.
            "return_routed_experts": False,
            "some_future_field": {"x": 1},
            "lora_path": None,
            "logprob_start_len": -1,
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["output_ids"] == tiny_model.greedy_ids[:4]
    # No sampling_params: SGLang's defaults (max_new_tokens 128, temperature 1).
    out = generate(server, {"input_ids": [10, 20, 30, 40]}).json()
    fin = out["meta_info"]["finish_reason"]
    assert fin["type"] in ("length", "stop")
    if fin["type"] == "length":
        assert fin == {"type": "length", "length": 128}
        assert out["meta_info"]["completion_tokens"] == 128
    assert out["meta_info"]["prompt_tokens"] == 4


# ---- concurrency ------------------------------------------------------------------------
def test_32_concurrent_streams_match_sequential(server: ServerHandle):
    prompts = [f"Request number {i} says" for i in range(8)]
    sampling = greedy(8, ignore_eos=True)
    sequential = [
        generate(server, {"text": p, "sampling_params": sampling}).json()["output_ids"]
        for p in prompts
    ]
    barrier = threading.Barrier(32)

    def client(i: int) -> list[int]:
        barrier.wait()
        events = stream_events(server, {"text": prompts[i % 8], "sampling_params": sampling})
        return [t for ev in events for t in ev["output_ids"]]

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(client, range(32)))
    for i, ids in enumerate(results):
        assert ids == sequential[i % 8], i
    m = server.wait_memory_all_free()
    assert m["failures"] == 0


# ---- disconnect and abort ---------------------------------------------------------------
def test_client_disconnect_frees_kv(server: ServerHandle):
    assert server.post("/flush_cache").status_code == 200
    prompt_ids = list(range(1000, 1020))
    body = {
        "input_ids": prompt_ids,
        "stream": True,
        "sampling_params": greedy(480, ignore_eos=True),
    }
    r = requests.post(server.base_url + "/generate", json=body, stream=True, timeout=60)
    got = 0
    for line in r.iter_lines():
        if line.startswith(b"data: {"):
            got += 1
            if got == 2:
                break
    r.close()  # client goes away mid-stream
    m = server.wait_memory_all_free(timeout=30)
    assert m["failures"] == 0
    # Aborted early: far fewer than the 500 tokens a finished request would have cached.
    assert m["evictable"] < len(prompt_ids) + 400, m


def _stream_in_thread(server: ServerHandle, body: dict) -> tuple[threading.Thread, dict]:
    result: dict = {}

    def run() -> None:
        r = requests.post(server.base_url + "/generate", json=body, timeout=120)
        result["status"] = r.status_code
        result["body"] = r.content

    t = threading.Thread(target=run)
    t.start()
    return t, result


def _wait_running(server: ServerHandle, n_slots: int, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = server.memory_accounting()
        if m["req_slots"] - m["free_req_slots"] >= n_slots:
            return
        time.sleep(0.05)
    raise AssertionError("requests never started running")


def test_abort_request_matches_the_exact_rid(server: ServerHandle):
    tag = uuid.uuid4().hex[:8]
    body = {
        "input_ids": [5, 6, 7, 8],
        "rid": f"abortme-{tag}-job10",
        "stream": True,
        "sampling_params": greedy(480, ignore_eos=True),
    }
    keep_body = {
        "input_ids": [9, 10, 11],
        "rid": f"keep-{tag}",
        "sampling_params": greedy(40, ignore_eos=True),
    }
    t, res = _stream_in_thread(server, body)
    t2, res2 = _stream_in_thread(server, keep_body)
    _wait_running(server, 1)
    # A prefix of its rid, an unknown rid, an empty rid or body abort nothing: SGLang 0.5.4
    # ignores a rid it does not hold, and a rid never selects another client's requests.
    for other in ({"rid": f"abortme-{tag}-job1"}, {"rid": f"abortme-{tag}"}, {"rid": ""}, {}):
        r = server.post("/abort_request", json=other)
        assert r.status_code == 200 and r.content == b""
    t2.join(60)
    kept = json.loads(res2["body"])
    assert kept["meta_info"]["finish_reason"] == {"type": "length", "length": 40}
    assert t.is_alive()  # 480 tokens take far longer than the bystander's 40
    r = server.post("/abort_request", json={"rid": f"abortme-{tag}-job10"})
    assert r.status_code == 200 and r.content == b""
    t.join(60)
    assert res["status"] == 200
    events = parse_sse(res["body"])
    fin = events[-1]["meta_info"]["finish_reason"]
    assert fin["type"] == "abort", fin
    assert events[-1]["meta_info"]["completion_tokens"] < 480
    assert server.wait_memory_all_free()["failures"] == 0


def test_abort_all(server: ServerHandle):
    threads = [
        _stream_in_thread(
            server,
            {"input_ids": [20 + i, 30, 40], "sampling_params": greedy(480, ignore_eos=True)},
        )
        for i in range(3)
    ]
    _wait_running(server, 3)
    assert server.post("/abort_request", json={"abort_all": True}).status_code == 200
    for t, res in threads:
        t.join(60)
        assert not t.is_alive()
        out = json.loads(res["body"])
        assert res["status"] == 200, out
        assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert server.wait_memory_all_free()["failures"] == 0


# ---- bad input --------------------------------------------------------------------------
BAD_BODIES = {
    "missing_input": {"sampling_params": {"max_new_tokens": 2}},
    "all_three_inputs": {"text": "hi", "input_ids": [1, 2], "input_embeds": [[0.1]]},
    "temperature_negative": {"text": "hi", "sampling_params": {"temperature": -1}},
    "top_p_zero": {"text": "hi", "sampling_params": {"top_p": 0}},
    "top_k_zero": {"text": "hi", "sampling_params": {"top_k": 0}},
    "unknown_sampling_key": {"text": "hi", "sampling_params": {"max_new_tokens": 2, "foo": 1}},
    "input_too_long": {"input_ids": [1] * 600},
    "empty_input_ids": {"input_ids": []},
    "input_ids_out_of_vocab": {"input_ids": [1, 10**7]},
    "input_ids_negative": {"input_ids": [1, -3]},
}


def test_text_with_input_ids_generates_from_the_ids(server: ServerHandle):
    """SGLang takes both: the ids are the prompt (the text is only kept as its input text)."""
    sp = {"max_new_tokens": 3, "temperature": 0}
    ids_only = generate(server, {"input_ids": [5, 6, 7], "sampling_params": sp})
    both = generate(
        server, {"text": "unrelated words", "input_ids": [5, 6, 7], "sampling_params": sp}
    )
    assert both.status_code == 200, both.text
    assert both.json()["output_ids"] == ids_only.json()["output_ids"]
    assert both.json()["meta_info"]["prompt_tokens"] == 3


@pytest.mark.parametrize("name", sorted(BAD_BODIES))
def test_bad_input_is_400(server: ServerHandle, name: str):
    r = generate(server, BAD_BODIES[name])
    assert r.status_code == 400, r.text
    err = r.json()
    assert list(err) == ["error"] and list(err["error"]) == ["message"]
    assert isinstance(err["error"]["message"], str) and err["error"]["message"]
    if name in ("missing_input", "all_three_inputs"):
        assert (
            err["error"]["message"] == "Either text, input_ids or input_embeds should be provided."
        )
    if name == "input_too_long":
        assert err["error"]["message"] == (
            "The input (600 tokens) is longer than the model's context length (512 tokens)."
        )


def test_malformed_json_is_400(server: ServerHandle):
    r = server.post(
        "/generate", data=b'{"text": "hi", ', headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400
    assert r.json()["error"]["message"]


def test_max_new_tokens_beyond_context_message(server: ServerHandle):
    r = generate(server, {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 600}})
    assert r.status_code == 400
    assert r.json() == {
        "error": {
            "message": "Requested token count exceeds the model's maximum context length of 512 "
            "tokens. You requested a total of 603 tokens: 3 tokens from the input messages and "
            "600 tokens for the completion. Please reduce the number of tokens in the input "
            "messages or the completion to fit within the limit."
        }
    }


def test_stream_validation_error_is_event_then_done(server: ServerHandle):
    r = generate(server, {"text": "hi", "stream": True, "sampling_params": {"temperature": -1}})
    # SGLang raises inside the stream generator: HTTP 200, an error event, then [DONE].
    assert r.status_code == 200
    events = parse_sse(r.content)
    assert len(events) == 1 and list(events[0]) == ["error"]
    assert "temperature" in events[0]["error"]["message"]
    assert r.content == b"data: " + compact(events[0]) + b"\n\ndata: [DONE]\n\n"


def test_server_still_serves_after_errors(server: ServerHandle, tiny_model: TinyModel):
    for body in BAD_BODIES.values():
        generate(server, body)
    r = generate(server, {"text": EOS_PROMPT, "sampling_params": greedy(3, ignore_eos=True)})
    assert r.status_code == 200
    assert r.json()["output_ids"] == tiny_model.greedy_ids[:3]
    assert server.wait_memory_all_free()["failures"] == 0


# ---- info, health, cache ----------------------------------------------------------------
def test_health_endpoints(server: ServerHandle):
    for path in ("/health", "/health_generate"):
        r = server.get(path)
        assert r.status_code == 200 and r.content == b"", path


def test_model_info(server: ServerHandle, tiny_model: TinyModel):
    for path in ("/get_model_info", "/model_info"):
        info = server.get(path).json()
        for key in (
            "model_path",
            "tokenizer_path",
            "is_generation",
            "preferred_sampling_params",
            "weight_version",
        ):
            assert key in info, (path, key)
        assert info["model_path"] == tiny_model.path
        assert info["is_generation"] is True
        assert info["weight_version"] == "default"


def test_server_info(server: ServerHandle, tiny_model: TinyModel):
    for path in ("/get_server_info", "/server_info"):
        r = server.get(path)
        assert r.status_code == 200
        info = json.loads(r.content)  # must be valid JSON (bench_serving parses it)
        assert info["model_path"] == tiny_model.path
        assert info["max_total_num_tokens"] == 4096
        assert isinstance(info["internal_states"], list) and len(info["internal_states"]) == 1
        state = info["internal_states"][0]
        assert "memory_usage" in state and "last_gen_throughput" in state
        assert state["memory_check_failures"] == 0


def test_v1_models(server: ServerHandle, tiny_model: TinyModel):
    data = server.get("/v1/models").json()
    assert data["object"] == "list"
    card = data["data"][0]
    assert card["id"] == tiny_model.path and card["root"] == tiny_model.path
    assert card["object"] == "model" and card["owned_by"] == "sglang"
    assert card["max_model_len"] == tiny_model.context_len


def test_flush_cache_when_idle(server: ServerHandle):
    server.wait_memory_all_free()
    for method in ("post", "get"):
        r = getattr(server, method)("/flush_cache")
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/plain")
        assert r.text.startswith("Cache flushed.\n")
    assert server.memory_accounting()["evictable"] == 0


def test_flush_cache_while_busy_is_400(server: ServerHandle):
    t, _ = _stream_in_thread(
        server, {"input_ids": [3, 4, 5], "sampling_params": greedy(300, ignore_eos=True)}
    )
    _wait_running(server, 1)
    r = server.post("/flush_cache")
    assert r.status_code == 400
    assert r.headers["content-type"].startswith("text/plain")
    server.post("/abort_request", json={"abort_all": True})
    t.join(60)


# ---- bench_serving ----------------------------------------------------------------------
def test_bench_serving_random_ids(server: ServerHandle, tmp_path: Path):
    out_file = tmp_path / "bench.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "mini_sglang.bench_serving",
        "--backend",
        "sglang",
        "--dataset-name",
        "random-ids",
        "--num-prompts",
        "16",
        "--random-input-len",
        "64",
        "--random-output-len",
        "16",
        "--host",
        "127.0.0.1",
        "--port",
        str(server.port),
        "--output-file",
        str(out_file),
        "--disable-tqdm",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("Successful requests:"))
    assert line.split()[-1] == "16", line
    record = json.loads(out_file.read_text().splitlines()[-1])
    assert record["completed"] == 16
    assert server.wait_memory_all_free()["failures"] == 0


@pytest.mark.parametrize(
    "field,message",
    [
        (
            {"input_embeds": [[0.1] * 8] * 3},
            "input_embeds is provided while disable_radix_cache is False. Please add "
            "`--disable-radix-cache` when you launch the server if you want to use "
            "input_embeds as inputs.",
        ),
        (
            {"input_ids": [1, 2, 3], "return_hidden_states": True},
            "The server is not configured to return the hidden states. "
            "Please set `--enable-return-hidden-states` to enable this feature.",
        ),
        (
            {"input_ids": [1, 2, 3], "custom_logit_processor": "{}"},
            "The server is not configured to enable custom logit processor. "
            "Please set `--enable-custom-logit-processor` to enable this feature.",
        ),
    ],
)
def test_unsupported_generate_features_are_400s(server: ServerHandle, field, message):
    """Fields that ask for what this server lacks get SGLang 0.5.4's 400 (input_embeds used
    to be a 500); the server keeps serving."""
    r = server.post("/generate", json={"sampling_params": {"max_new_tokens": 2}, **field})
    assert r.status_code == 400 and r.json() == {"error": {"message": message}}, r.text
    ok = server.post(
        "/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}
    )
    assert ok.status_code == 200

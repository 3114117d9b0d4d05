"""Requests a hostile client sends: none may stop the server, corrupt its state or touch
another client's work. One shared server (conftest `server`).

- Values the scheduler's tensors cannot hold (a seed outside int64, a bias outside
  float32) and non-finite floats are a 400 naming the field and its range.
- A refused batch with a repeated rid leaves nothing behind.
- An abort reaches exactly the rid (and the sub-requests of the client's own batch), never
  another client's request whose rid merely starts with it; an empty rid is refused.
- A request whose preparation fails in the scheduler ends alone with a 500 (the shared
  server is started with the MINI_SGLANG_TEST_FAIL_PREPARE_RID test hook).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests

from tests.server.conftest import FAIL_PREPARE_RID, ServerHandle, parse_sse

INT64 = "[-9223372036854775808, 9223372036854775807]"
FLOAT32 = "[-3.4028234663852886e+38, 3.4028234663852886e+38]"
MSGS = [{"role": "user", "content": "Hi"}]


def post_raw(server: ServerHandle, path: str, body: dict[str, Any]) -> requests.Response:
    """POST with Python's json, which writes NaN / Infinity literals as SGLang's clients do."""
    return server.post(path, data=json.dumps(body), headers={"Content-Type": "application/json"})


def error_message(r: requests.Response) -> str:
    payload = r.json()
    return payload["message"] if "message" in payload else payload["error"]["message"]


def assert_healthy(server: ServerHandle) -> None:
    assert server.proc.poll() is None, server.log_tail()
    assert server.get("/health_generate").status_code == 200


# ---- values the batch tensors cannot hold ----------------------------------------------
def test_seed_outside_int64_is_a_400(server: ServerHandle):
    # (orjson reads an integer below int64 as a float: -2**63 - 1 arrives as -2**63.)
    for seed in (2**63, -(2**64)):
        r = server.post(
            "/generate", json={"text": "Hi", "sampling_params": {"sampling_seed": seed}}
        )
        assert r.status_code == 400, r.text
        assert error_message(r).startswith(f"sampling_seed must be in {INT64}, got ")
    for path, body in (
        ("/v1/completions", {"model": "m", "prompt": "Hi", "max_tokens": 2}),
        ("/v1/chat/completions", {"model": "m", "messages": MSGS, "max_tokens": 2}),
    ):
        r = server.post(path, json={**body, "seed": 2**63})
        assert r.status_code == 400, r.text
        assert f"seed must be in {INT64}, got 9223372036854775808." in error_message(r)
    # The edges themselves are fine.
    sp = {"sampling_seed": 2**63 - 1, "max_new_tokens": 2, "temperature": 0.7}
    assert server.post("/generate", json={"text": "Hi", "sampling_params": sp}).status_code == 200
    assert_healthy(server)


def test_logit_bias_outside_float32_is_a_400(server: ServerHandle):
    body = {"model": "m", "messages": MSGS, "max_tokens": 2, "logit_bias": {"1": 1e39}}
    r = server.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert error_message(r) == (
        f"logit_bias values must be finite numbers in {FLOAT32}, got 1e+39 for token 1."
    )
    sp = {"logit_bias": {"1": -1e39}, "max_new_tokens": 2}
    r = server.post("/generate", json={"text": "Hi", "sampling_params": sp})
    assert r.status_code == 400, r.text
    assert "got -1e+39 for token 1." in error_message(r)
    assert_healthy(server)


def test_non_finite_floats_are_a_400(server: ServerHandle):
    chat = {"model": "m", "messages": MSGS, "max_tokens": 2}
    for field in ("temperature", "top_p", "frequency_penalty", "repetition_penalty", "min_p"):
        for value in (float("nan"), float("inf"), -float("inf")):
            r = post_raw(server, "/v1/chat/completions", {**chat, field: value})
            assert r.status_code == 400, (field, value, r.text)
            assert error_message(r).startswith(field), error_message(r)
    r = post_raw(server, "/v1/chat/completions", {**chat, "temperature": float("nan")})
    assert error_message(r) == f"temperature must be a finite number in {FLOAT32}, got nan."
    r = post_raw(server, "/v1/completions", {"model": "m", "prompt": "Hi", "temperature": 1e39})
    assert r.status_code == 400 and "got 1e+39." in error_message(r), r.text
    r = post_raw(server, "/v1/chat/completions", {**chat, "logit_bias": {"5": float("nan")}})
    assert r.status_code == 400, r.text
    assert error_message(r).endswith("got nan for token 5.")
    assert_healthy(server)


# ---- rids ------------------------------------------------------------------------------
def test_duplicate_rid_in_a_batch_leaves_nothing_behind(server: ServerHandle):
    rid = f"dup-rid-{uuid.uuid4().hex[:8]}"
    body = {"text": ["a", "b"], "rid": [rid, rid], "sampling_params": {"max_new_tokens": 2}}
    r = server.post("/generate", json=body)
    assert r.status_code == 400 and error_message(r) == f"Duplicate request ID: {rid}", r.text
    for _ in range(2):  # the rid is free again, and again after it finished
        r = server.post(
            "/generate", json={"text": "Hi", "rid": rid, "sampling_params": {"max_new_tokens": 2}}
        )
        assert r.status_code == 200, r.text


def test_empty_rid_is_refused(server: ServerHandle):
    for rid in ("", ["a-rid", ""]):
        text = "Hi" if isinstance(rid, str) else ["a", "b"]
        r = server.post("/generate", json={"text": text, "rid": rid})
        assert r.status_code == 400, r.text
        assert error_message(r) == "The rid should be a non-empty string."
    body = {"model": "m", "messages": MSGS, "max_tokens": 2, "rid": ""}
    r = server.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and "non-empty" in error_message(r), r.text


def _stream(server: ServerHandle, body: dict) -> tuple[threading.Thread, dict]:
    result: dict = {}

    def run() -> None:
        r = requests.post(server.base_url + "/generate", json={**body, "stream": True}, timeout=120)
        result["status"], result["events"] = r.status_code, parse_sse(r.content)

    t = threading.Thread(target=run)
    t.start()
    return t, result


def _running(server: ServerHandle, n: int) -> None:
    deadline = time.time() + 30
    while time.time() < deadline:
        m = server.memory_accounting()
        if m["req_slots"] - m["free_req_slots"] >= n:
            return
        time.sleep(0.05)
    raise AssertionError("requests never started running")


def _finish(result: dict) -> dict:
    assert result["status"] == 200
    return result["events"][-1]["meta_info"]["finish_reason"]


def test_disconnect_aborts_only_its_own_rid(server: ServerHandle):
    """A client whose rid is a prefix of another client's rid goes away mid-stream: only
    its own request is aborted."""
    tag = uuid.uuid4().hex[:8]
    victim = {"input_ids": [5, 6, 7], "rid": f"victim-{tag}-job10"}
    t, res = _stream(
        server, {**victim, "sampling_params": {"max_new_tokens": 120, "ignore_eos": True}}
    )
    _running(server, 1)
    body = {"input_ids": [8, 9], "rid": f"victim-{tag}-job1", "stream": True}
    body["sampling_params"] = {"max_new_tokens": 400, "ignore_eos": True}
    r = requests.post(server.base_url + "/generate", json=body, stream=True, timeout=60)
    next(line for line in r.iter_lines() if line.startswith(b"data: {"))
    r.close()  # job1's client goes away
    t.join(120)
    assert _finish(res) == {"type": "length", "length": 120}
    assert server.wait_memory_all_free()["failures"] == 0


def test_abort_by_the_batch_rid_reaches_its_own_sub_requests(server: ServerHandle):
    tag = uuid.uuid4().hex[:8]
    sp = {"max_new_tokens": 480, "ignore_eos": True}
    t, res = _stream(
        server, {"input_ids": [[11, 12], [13, 14]], "rid": f"par-{tag}", "sampling_params": sp}
    )
    t2, res2 = _stream(
        server,
        {
            "input_ids": [15, 16],
            "rid": f"par-{tag}_0x",
            "sampling_params": {**sp, "max_new_tokens": 60},
        },
    )
    _running(server, 3)
    assert server.post("/abort_request", json={"rid": f"par-{tag}"}).status_code == 200
    t.join(60)
    t2.join(120)
    finals = {}
    for ev in res["events"]:
        if ev["meta_info"]["finish_reason"] is not None:
            finals[ev["index"]] = ev["meta_info"]["finish_reason"]["type"]
    assert finals == {0: "abort", 1: "abort"}
    assert _finish(res2) == {"type": "length", "length": 60}  # another client's rid
    assert server.wait_memory_all_free()["failures"] == 0


# ---- containment ---------------------------------------------------------------------
FAIL_RID = FAIL_PREPARE_RID  # the shared server's test hook fails preparing this rid


def test_a_request_that_fails_in_preparation_ends_alone(server: ServerHandle, tiny_model):
    """Sent with others at once (so it is batched with them): it gets a 500 with the
    error, the others get exactly their greedy output, and the server serves on."""
    greedy = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
    bodies = [
        {"input_ids": tiny_model.eos_prompt_ids, "rid": rid, "sampling_params": greedy}
        for rid in ("ok-0", FAIL_RID, "ok-2", "ok-3")
    ]
    with ThreadPoolExecutor(len(bodies)) as pool:
        replies = list(pool.map(lambda b: server.post("/generate", json=b), bodies))
    message = f"Internal server error: test hook: preparing request {FAIL_RID} fails"
    assert replies[1].status_code == 500, replies[1].text
    assert replies[1].json() == {
        "object": "error",
        "message": message,
        "type": "500",
        "param": None,
        "code": 500,
    }
    for r in replies[:1] + replies[2:]:
        assert r.status_code == 200, r.text
        assert r.json()["output_ids"] == tiny_model.greedy_ids[:6]
    chat = {"model": "m", "messages": MSGS, "max_tokens": 2, "rid": FAIL_RID}
    r = server.post("/v1/chat/completions", json=chat)
    assert r.status_code == 500 and r.json()["message"] == message, r.text
    assert_healthy(server)
    assert server.wait_memory_all_free()["failures"] == 0
    assert "Building a batch's sampling tensors failed" in server.log()

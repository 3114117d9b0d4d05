"""/start_profile, /stop_profile, /pause_generation and /continue_generation on the real
multi-process server (the shared tiny-Llama `server`), with SGLang 0.5.4's replies.

Profiling: a num_steps profile stops by itself and leaves a gzipped Chrome trace named
`<profile id>-TP-0.trace.json.gz`; a manual one is written by /stop_profile; a second start
or a stop without a start is 0.5.4's 500; a badly typed body is the validation 400;
bench_serving --profile drives both routes (trace in the default dir, /tmp).
/freeze_gc: 200 "Garbage collection frozen.\n" for GET and POST, and each of the HTTP,
scheduler and detokenizer processes logs SGLang's "Freezing GC in ... process" line;
generation is unchanged afterwards.
/slow_down: 200 `null`; while set, each forward waits forward_sleep_time; null ends it; a
non-number is a 400.
/configure_logging: turns --log-requests on and off and sets its level at run time (200,
empty body); the HTTP process then logs SGLang's "Receive: obj=..." and "Finish: obj=...,
out=..." lines per request, at that level's detail; a bad type or level is a 400.
Pause (0.5.4): in-flight requests are aborted, a /generate sent while paused is held (the
scheduler never sees it) until /continue_generation, then completes with the same greedy
output as an unpaused run; afterwards every KV slot is free and the idle check is clean.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.server.conftest import ServerHandle, parse_sse

START_TEXT = "Start profiling.\n"
STOP_TEXT = "Stop profiling. This will take some time.\n"
PAUSED = {"message": "Generation paused successfully.", "status": "ok"}
CONTINUED = {"message": "Generation continued successfully.", "status": "ok"}
PROMPT_IDS = [11, 22, 33, 44, 55]


def greedy(n: int, **kw: Any) -> dict:
    return {"max_new_tokens": n, "temperature": 0.0, **kw}


def load_trace(path: str | Path) -> dict:
    """A gzipped Chrome trace with complete ("X") events, as torch.profiler writes it."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        trace = json.load(fh)
    events = trace["traceEvents"]
    assert isinstance(events, list) and events, path
    assert any(e.get("ph") == "X" and e.get("name") for e in events), path
    return trace


def wait_for_files(pattern: str, timeout: float = 30.0) -> list[str]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        files = glob.glob(pattern)
        if files:
            time.sleep(0.2)  # the export writes a temp file and renames it; let it finish
            return files
        time.sleep(0.1)
    raise AssertionError(f"no file matching {pattern} within {timeout}s")


def generate(server: ServerHandle, input_ids: list[int], n: int, **kw: Any) -> dict:
    r = server.post("/generate", json={"input_ids": input_ids, "sampling_params": greedy(n, **kw)})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture
def no_profile_left(server: ServerHandle):
    yield
    server.post("/stop_profile")  # a failed test must not leave a trace running


# ---- profiling --------------------------------------------------------------------------
def test_profile_num_steps_stops_by_itself(server: ServerHandle, tmp_path: Path, no_profile_left):
    r = server.post(
        "/start_profile",
        json={"output_dir": str(tmp_path), "num_steps": 3, "activities": ["CPU"]},
    )
    assert r.status_code == 200 and r.text == START_TEXT
    for i in range(2):
        generate(server, PROMPT_IDS[i:], 6, ignore_eos=True)
    (path,) = wait_for_files(str(tmp_path / "*.trace.json.gz"))
    # SGLang's name: the profile id (start time) and the TP rank.
    assert re.fullmatch(r"\d+\.\d+-TP-0\.trace\.json\.gz", os.path.basename(path)), path
    load_trace(path)
    # Already stopped by num_steps: a stop now is 0.5.4's unhandled RuntimeError.
    r = server.post("/stop_profile")
    assert r.status_code == 500 and r.text == "Internal Server Error"


def test_profile_body_is_coerced_as_sglang(server: ServerHandle, tmp_path: Path, no_profile_left):
    """SGLang validates the body with pydantic's lax mode: "15" is start_step 15."""
    body = {"output_dir": str(tmp_path), "start_step": "15", "num_steps": "2"}
    r = server.post("/start_profile", json={**body, "activities": ["CPU"]})
    assert (r.status_code, r.text) == (200, START_TEXT)
    generate(server, PROMPT_IDS, 24, ignore_eos=True)  # reaches forward step 15 + 2
    wait_for_files(str(tmp_path / "*.trace.json.gz"))


def test_profile_manual_and_errors(server: ServerHandle, tmp_path: Path, no_profile_left):
    r = server.post("/stop_profile")
    assert (r.status_code, r.text) == (500, "Internal Server Error")
    body = {
        "output_dir": str(tmp_path / "sub"),  # created at stop
        "profile_id": "manual",
        "record_shapes": True,
        "with_stack": False,
        "unknown_key": 1,  # ignored, as FastAPI ignores it
    }
    r = server.post("/start_profile", json=body)
    assert (r.status_code, r.text) == (200, START_TEXT)
    r = server.post("/start_profile", json=body)  # already running
    assert (r.status_code, r.text) == (500, "Internal Server Error")
    generate(server, PROMPT_IDS, 4)
    r = server.get("/stop_profile")
    assert (r.status_code, r.text) == (200, STOP_TEXT)
    # Written before the reply.
    trace = load_trace(tmp_path / "sub" / "manual-TP-0.trace.json.gz")
    assert any("Input Dims" in (e.get("args") or {}) for e in trace["traceEvents"])
    r = server.post("/start_profile", json={"num_steps": "three"})
    assert r.status_code == 400 and r.json()["code"] == 400
    r = server.post("/stop_profile")
    assert r.status_code == 500  # the bad body started nothing


def test_bench_serving_profile(server: ServerHandle, tmp_path: Path, no_profile_left):
    # bench_serving POSTs without a body: traces go to $SGLANG_TORCH_PROFILER_DIR or /tmp.
    pattern = "/tmp/[0-9]*.[0-9]*-TP-0.trace.json.gz"
    before = set(glob.glob(pattern))
    cmd = [
        sys.executable,
        "-m",
        "mini_sglang.bench_serving",
        "--backend",
        "sglang",
        "--dataset-name",
        "random-ids",
        "--num-prompts",
        "4",
        "--random-input-len",
        "16",
        "--random-output-len",
        "4",
        "--port",
        str(server.port),
        "--output-file",
        str(tmp_path / "bench.jsonl"),
        "--disable-tqdm",
        "--profile",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Profiler started" in proc.stdout and "Profiler stopped" in proc.stdout, proc.stdout
    new = set(glob.glob(pattern)) - before
    try:
        assert len(new) == 1, new
        load_trace(next(iter(new)))
    finally:
        for f in new:
            os.remove(f)


# ---- pause / continue -------------------------------------------------------------------
def _in_thread(fn, *args: Any) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def run() -> None:
        try:
            box["result"] = fn(*args)
        except Exception as e:  # reported by the test
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def _stream_long(server: ServerHandle, started: threading.Event) -> list[dict]:
    body = {"input_ids": [3, 4, 5], "sampling_params": greedy(400, ignore_eos=True)}
    body["stream"] = True
    with requests.post(server.base_url + "/generate", json=body, stream=True, timeout=120) as r:
        chunks = []
        for chunk in r.iter_content(chunk_size=None):
            chunks.append(chunk)
            started.set()
        return parse_sse(b"".join(chunks))


def _scheduler_load(server: ServerHandle) -> tuple[int, int]:
    state = server.get("/get_server_info").json()["internal_states"][0]
    return state["num_running_reqs"], state["num_queue_reqs"]


def test_pause_aborts_holds_and_continues(server: ServerHandle):
    reference = generate(server, PROMPT_IDS, 8)["output_ids"]
    started = threading.Event()
    long_t, long_box = _in_thread(_stream_long, server, started)
    assert started.wait(30), long_box
    try:
        r = server.post("/pause_generation")
        assert r.status_code == 200 and r.json() == PAUSED
        # 0.5.4: pausing aborts what is in flight.
        long_t.join(30)
        assert not long_t.is_alive() and "error" not in long_box, long_box
        events = long_box["result"]
        assert events[-1]["meta_info"]["finish_reason"]["type"] == "abort", events[-1]
        assert sum(len(e["output_ids"]) for e in events) < 400
        # A request sent while paused waits in the TokenizerManager, not the scheduler.
        held_t, held_box = _in_thread(generate, server, PROMPT_IDS, 8)
        time.sleep(1.5)
        assert held_t.is_alive(), held_box
        assert _scheduler_load(server) == (0, 0)
        assert server.post("/pause_generation").json() == PAUSED  # pausing again is fine
        time.sleep(0.5)
        assert held_t.is_alive(), held_box
    finally:
        r = server.post("/continue_generation")
    assert r.status_code == 200 and r.json() == CONTINUED
    held_t.join(60)
    assert not held_t.is_alive() and "error" not in held_box, held_box
    out = held_box["result"]
    assert out["output_ids"] == reference
    assert out["meta_info"]["finish_reason"]["type"] == "length"
    assert server.post("/continue_generation").json() == CONTINUED  # not paused: no-op
    assert generate(server, PROMPT_IDS, 8)["output_ids"] == reference
    assert server.wait_memory_all_free()["failures"] == 0


def test_freeze_gc_freezes_every_process(server: ServerHandle):
    reference = generate(server, PROMPT_IDS, 8)["output_ids"]
    for method in (server.get, server.post):
        r = method("/freeze_gc")
        assert r.status_code == 200 and r.text == "Garbage collection frozen.\n"
    pattern = r"Freezing GC in {} process\. gen0: \d+->\d+, gen1: \d+->\d+, gen2: \d+->\d+"
    deadline = time.time() + 30
    for context in ("Tokenizer Manager", "Scheduler", "Detokenizer Manager"):
        # The scheduler and the detokenizer freeze after the reply (nothing waits for them).
        while len(re.findall(pattern.format(context), server.log())) < 2:
            assert time.time() < deadline, (
                f"no freeze logged by the {context}:\n{server.log_tail()}"
            )
            time.sleep(0.2)
    assert generate(server, PROMPT_IDS, 8)["output_ids"] == reference
    assert server.wait_memory_all_free()["failures"] == 0


def _log_lines_since(server: ServerHandle, start: int, prefix: str) -> list[str]:
    return [ln for ln in server.log()[start:].splitlines() if prefix in ln]


def test_configure_logging_turns_request_logging_on_and_off(server: ServerHandle):
    ids = [7, 8, 9, 10]
    try:
        mark = len(server.log())
        r = server.post("/configure_logging", json={"log_requests": True, "log_requests_level": 0})
        assert r.status_code == 200 and r.content == b""
        out = generate(server, ids, 3)
        rid = out["meta_info"]["id"]
        time.sleep(0.5)  # the log is written by another process
        (receive,) = _log_lines_since(server, mark, "Receive: obj=GenerateReqInput(")
        (finish,) = _log_lines_since(server, mark, "Finish: obj=GenerateReqInput(")
        assert f"rid='{rid}'" in receive and "input_ids=" not in receive, receive
        assert "sampling_params=" not in receive, receive
        assert "out={'meta_info': {" in finish and "'output_ids'" not in finish, finish
        # level 3: everything, including the prompt ids and the output ids
        mark = len(server.log())
        assert server.get("/configure_logging", json={"log_requests_level": 3}).status_code == 200
        out = generate(server, ids, 3)
        time.sleep(0.5)
        (receive,) = _log_lines_since(server, mark, "Receive: obj=")
        (finish,) = _log_lines_since(server, mark, "Finish: obj=")
        assert "input_ids=[7, 8, 9, 10]" in receive, receive
        assert f"'output_ids': {out['output_ids']}" in finish, finish
        # a misfit field: SGLang's validation 400; anything else: the {"error": ...} 400
        validation = {"log_requests": [1]}
        r = server.post("/configure_logging", json=validation)
        assert r.status_code == 400, r.text
        assert r.json()["message"] == "body.log_requests: Input should be a valid boolean"
        for bad, message in (
            ({"log_requests_level": 7}, "log_requests_level must be one of [0, 1, 2, 3], got 7."),
            ([1], "The request body must be a JSON object."),
        ):
            r = server.post("/configure_logging", json=bad)
            assert r.status_code == 400 and r.json() == {"error": {"message": message}}, r.text
    finally:
        assert server.post("/configure_logging", json={"log_requests": False}).status_code == 200
    mark = len(server.log())
    generate(server, ids, 3)
    time.sleep(0.5)
    assert not _log_lines_since(server, mark, "Receive: obj=")
    assert server.wait_memory_all_free()["failures"] == 0


def test_slow_down_sleeps_before_each_forward_until_reset(server: ServerHandle):
    ids = [3, 4, 5]
    try:
        r = server.post("/slow_down", json={"forward_sleep_time": 0.4})
        assert r.status_code == 200 and r.content == b"null", r.text
        start = time.monotonic()
        out = generate(server, ids, 4)  # a prefill and three decode forwards at least
        assert time.monotonic() - start >= 4 * 0.4
        r = server.post("/slow_down", json={"forward_sleep_time": "soon"})
        assert r.status_code == 400, r.text
        assert r.json()["message"] == (
            "body.forward_sleep_time: Input should be a valid number, unable to parse string "
            "as a number"
        )
    finally:
        assert server.post("/slow_down", json={"forward_sleep_time": None}).status_code == 200
    start = time.monotonic()
    assert generate(server, ids, 4)["output_ids"] == out["output_ids"]
    assert time.monotonic() - start < 4 * 0.4
    assert "Scheduler.run_batch sleep 0.4s" in server.log()

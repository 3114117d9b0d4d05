"""Custom logit processors through the real server (--enable-custom-logit-processor, tiny
random Llama, CPU, overlap scheduling on).

The processor strings are made the way a client makes them: a script whose `__main__`
defines `CustomLogitProcessor` subclasses and prints `to_str()`, so dill pickles the classes
by value (nothing of this test module is importable in the server for them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mini_sglang.sampling.custom_logit_processor import DisallowedTokensLogitsProcessor
from tests.server.conftest import ServerHandle, TinyModel, launch_server, parse_sse

REPO = Path(__file__).resolve().parents[2]
CLIENT = """
import json
from mini_sglang.sampling.custom_logit_processor import CustomLogitProcessor

class ForceByCount(CustomLogitProcessor):
    # Stateful: the token forced is custom_params["tokens"][number of output ids so far].
    def __call__(self, logits, custom_param_list=None):
        for i, params in enumerate(custom_param_list):
            tokens = params["tokens"]
            forced = tokens[len(params["__req__"].output_ids) % len(tokens)]
            logits[i, :] = -float("inf")
            logits[i, forced] = 0.0
        return logits

class Explode(CustomLogitProcessor):
    def __call__(self, logits, custom_param_list=None):
        raise ValueError("kaboom")

print(json.dumps({"force": ForceByCount.to_str(), "explode": Explode.to_str()}))
"""
PROMPT = "The capital of France is"
EXPLODE_MESSAGE = "Custom logit processor Explode failed: ValueError: kaboom"
FLAG_OFF = (
    "The server is not configured to enable custom logit processor. "
    "Please set `--enable-custom-logit-processor` to enable this feature."
)


def client_processor_strings() -> dict[str, str]:
    """CLIENT's processors as a client script prints them, plus the built-in ban."""
    path = [str(REPO), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CLIENT)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    strings = json.loads(out.stdout)
    strings["ban"] = DisallowedTokensLogitsProcessor.to_str()
    return strings


@pytest.fixture(scope="module")
def procs() -> dict[str, str]:
    return client_processor_strings()


@pytest.fixture(scope="module")
def cserver(tiny_model: TinyModel, server_logs: Path) -> Iterator[ServerHandle]:
    handle = launch_server(tiny_model.path, "--enable-custom-logit-processor", log_dir=server_logs)
    yield handle
    handle.stop()


def generate(server: ServerHandle, proc: str | None = None, params: dict | None = None, **sp):
    body: dict[str, Any] = {
        "text": sp.pop("text", PROMPT),
        "sampling_params": {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True, **sp},
    }
    if params is not None:
        body["sampling_params"]["custom_params"] = params
    if proc is not None:
        body["custom_logit_processor"] = proc
    r = server.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_disallowed_tokens_change_greedy_output(cserver: ServerHandle, procs):
    """Banning the first greedy token gives what a -1e5 logit_bias on it gives, and the
    banned token never appears."""
    plain = generate(cserver)["output_ids"]
    banned = plain[0]
    out = generate(cserver, procs["ban"], {"token_ids": [banned]})["output_ids"]
    biased = generate(cserver, logit_bias={str(banned): -1e5})["output_ids"]
    assert out == biased and out[0] != plain[0] and banned not in out


def test_stateful_processor_reads_the_request(cserver: ServerHandle, procs):
    """`__req__`'s output_ids count every earlier token (prefill and each decode step), so
    the forced tokens come out in order."""
    tokens = [11, 22, 33]
    out = generate(cserver, procs["force"], {"tokens": tokens}, max_new_tokens=7)
    assert out["output_ids"] == [11, 22, 33, 11, 22, 33, 11]
    streamed = cserver.post(
        "/generate",
        json={
            "text": PROMPT,
            "stream": True,
            "custom_logit_processor": procs["force"],
            "sampling_params": {
                "temperature": 0.7,
                "max_new_tokens": 4,
                "custom_params": {"tokens": [5, 6]},
            },
        },
    )
    chunks = [e["output_ids"] for e in parse_sse(streamed.content)]  # each event's new ids
    assert sum(chunks, []) == [5, 6, 5, 6]


def test_mixed_batch_matches_each_request_alone(cserver: ServerHandle, procs, tiny_model):
    """Two different processors and none, in one batch with other requests joining and
    finishing at different steps: every request gets what it gets alone."""
    cases = [
        ("A story:", procs["ban"], {"token_ids": [7, 8]}, 9),
        ("Numbers:", procs["force"], {"tokens": [40, 41, 42, 43]}, 6),
        ("Hello there", None, None, 4),
        ("Colors are", procs["force"], {"tokens": [50]}, 3),
        ("One two", None, None, 10),
    ]
    alone = [
        generate(cserver, p, c, text=t, max_new_tokens=n)["output_ids"] for t, p, c, n in cases
    ]
    # One request already running (processor rows in the running batch) while the batch
    # joins; it also finishes last.
    long = {}
    runner = threading.Thread(
        target=lambda: long.update(
            generate(
                cserver, procs["ban"], {"token_ids": [7, 8]}, text="A story:", max_new_tokens=40
            )
        )
    )
    runner.start()
    body = {
        "text": [t for t, _, _, _ in cases],
        "custom_logit_processor": [p for _, p, _, _ in cases],
        "sampling_params": [
            {"temperature": 0, "max_new_tokens": n, "ignore_eos": True}
            | ({"custom_params": c} if c is not None else {})
            for _, _, c, n in cases
        ],
    }
    r = cserver.post("/generate", json=body)
    runner.join()
    assert r.status_code == 200, r.text
    assert [o["output_ids"] for o in r.json()] == alone
    assert long["output_ids"][:9] == alone[0]


def test_openai_routes_pass_processor_and_params(cserver: ServerHandle, procs, tokenizer):
    ids = tokenizer.encode("red green blue")
    params = {"tokens": ids}
    comp = cserver.post(
        "/v1/completions",
        json={
            "model": "m",
            "prompt": PROMPT,
            "max_tokens": len(ids),
            "custom_logit_processor": procs["force"],
            "custom_params": params,
        },
    )
    assert comp.status_code == 200, comp.text
    assert comp.json()["choices"][0]["text"] == "red green blue"
    chat = cserver.post(
        "/v1/chat/completions",
        json={
            "model": "m",
            "messages": [{"role": "user", "content": "Say it"}],
            "max_tokens": len(ids),
            "custom_logit_processor": procs["force"],
            "custom_params": params,
        },
    )
    assert chat.status_code == 200, chat.text
    assert chat.json()["choices"][0]["message"]["content"] == "red green blue"


def test_raising_processor_finishes_only_its_request(cserver: ServerHandle, procs):
    other: dict = {}
    runner = threading.Thread(
        target=lambda: other.update(generate(cserver, max_new_tokens=30, text="Keep going"))
    )
    runner.start()
    bad = generate(cserver, procs["explode"], {}, max_new_tokens=5)
    runner.join()
    reason = bad["meta_info"]["finish_reason"]
    assert reason["type"] == "abort" and reason["message"] == EXPLODE_MESSAGE
    assert other["meta_info"]["finish_reason"] == {"type": "length", "length": 30}
    assert len(other["output_ids"]) == 30
    assert cserver.get("/health_generate").status_code == 200
    assert "Custom logit processor Explode failed on 1 row(s)" in cserver.log()
    assert generate(cserver, procs["force"], {"tokens": [9]}, max_new_tokens=2)["output_ids"] == [
        9,
        9,
    ]


def test_a_string_that_does_not_load_is_a_400(cserver: ServerHandle):
    r = cserver.post(
        "/generate",
        json={"text": PROMPT, "custom_logit_processor": "{}", "sampling_params": {}},
    )
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert message.startswith("Invalid custom_logit_processor: ValueError:"), message


def test_flag_off_is_sglangs_400(server: ServerHandle, procs):
    """Without the flag: SGLang's status, body and log line, and nothing runs."""
    r = server.post(
        "/generate",
        json={"text": PROMPT, "custom_logit_processor": procs["force"], "sampling_params": {}},
    )
    assert r.status_code == 400 and r.json() == {"error": {"message": FLAG_OFF}}
    assert f"[http_server] Error: {FLAG_OFF}" in server.log()

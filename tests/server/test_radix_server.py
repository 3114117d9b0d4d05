"""RadixAttention on the real multi-process server (tiny random Llama, CPU).

Servers: the session's shared `server` (radix cache, page size 1), one with
--page-size 16, and a --disable-radix-cache reference that also runs one request at a time
with a two-request queue limit. Checked: shared-prefix prompts report meta_info.cached_tokens
equal to the prefix (page-aligned) and give the reference's greedy outputs; a request beyond
--max-queued-requests is refused at once with SGLang's retryable 503; /flush_cache is 200 when idle
(tree empty afterwards) and 400 while a request runs; the idle self-check never fired.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.server.conftest import ServerHandle, TinyModel, launch_server

PREFIX_LEN = 200
MAX_NEW = 12


@pytest.fixture(scope="module")
def paged_server(tiny_model: TinyModel, server_logs: Path) -> Iterator[ServerHandle]:
    handle = launch_server(tiny_model.path, "--page-size", "16", log_dir=server_logs)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def reference_server(tiny_model: TinyModel, server_logs: Path) -> Iterator[ServerHandle]:
    handle = launch_server(
        tiny_model.path,
        "--disable-radix-cache",
        "--max-running-requests",
        "1",
        "--max-queued-requests",
        "2",
        log_dir=server_logs,
    )
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    """Five prompts: a random 200-token prefix, then distinct questions whose first tokens
    differ (so a hit is exactly the prefix)."""
    rng = random.Random(20240)
    prefix = [rng.randrange(100, 50_000) for _ in range(PREFIX_LEN)]
    firsts = rng.sample(range(50_000, 60_000), 5)
    return [
        prefix + [f] + [rng.randrange(100, 50_000) for _ in range(3 + 4 * i)]
        for i, f in enumerate(firsts)
    ]


def _generate(handle: ServerHandle, input_ids, max_new: int = MAX_NEW, **kw) -> requests.Response:
    body = {
        "input_ids": input_ids,
        "sampling_params": {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True},
        **kw,
    }
    return handle.post("/generate", json=body)


@pytest.fixture(scope="module")
def reference_outputs(reference_server: ServerHandle, prompts) -> list[list[int]]:
    outs = []
    for ids in prompts:  # one by one: the reference server queues at most two
        r = _generate(reference_server, ids)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["meta_info"]["cached_tokens"] == 0
        outs.append(out["output_ids"])
    assert all(len(o) == MAX_NEW and len(set(o)) >= 4 for o in outs), outs
    return outs


def _run_shared_prefix(handle: ServerHandle, prompts) -> tuple[list[list[int]], list[int]]:
    """The first prompt alone (it fills the tree), then the other four as one batch."""
    first = _generate(handle, prompts[0])
    assert first.status_code == 200, first.text
    rest = _generate(handle, prompts[1:])
    assert rest.status_code == 200, rest.text
    outs = [first.json(), *rest.json()]
    return [o["output_ids"] for o in outs], [o["meta_info"]["cached_tokens"] for o in outs]


@pytest.mark.parametrize("page_size", [1, 16])
def test_shared_prefix_cached_tokens_and_outputs(
    request, prompts, reference_outputs, page_size: int
) -> None:
    handle = request.getfixturevalue("server" if page_size == 1 else "paged_server")
    outs, cached = _run_shared_prefix(handle, prompts)
    assert outs == reference_outputs
    assert cached == [0] + [PREFIX_LEN // page_size * page_size] * 4, cached
    m = handle.wait_memory_all_free()
    assert m["evictable"] > 0 and m["failures"] == 0, m


def _stream_until_running(
    handle: ServerHandle, rid: str, max_new: int
) -> tuple[requests.Response, Iterator[bytes]]:
    """Start a long streaming request and return once its first token arrived (it is then
    in the running batch): the response and its line iterator, which the caller must hold
    while the request should run. Dropping an unfinished iterator closes the connection
    (urllib3 does on the generator's exit), and the server then aborts the request."""
    body = {
        "input_ids": [11, 12, 13, 14],
        "rid": rid,
        "stream": True,
        "sampling_params": {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True},
    }
    resp = requests.post(handle.base_url + "/generate", json=body, stream=True, timeout=300)
    assert resp.status_code == 200
    lines = resp.iter_lines()
    for line in lines:
        if line.startswith(b"data: {"):
            assert json.loads(line[6:])["output_ids"]
            return resp, lines
    raise AssertionError("stream ended without a token")


def test_max_queued_requests_refused_at_once(reference_server: ServerHandle) -> None:
    """--max-running-requests 1 --max-queued-requests 2 and a burst of 12 requests of 48
    tokens (/generate, /v1/completions and /v1/responses in turn): one runs, two wait, and
    the ones beyond are answered at once with SGLang's HTTP 503 "The request queue is
    full." (its HTTPException body; /v1/responses' nested envelope) while accepted work is
    still running; each accepted request completes in full, and nothing of the refused ones
    stays behind."""
    n = 12

    def send(i: int) -> tuple[requests.Response, float]:
        t0 = time.perf_counter()
        if i % 3 == 1:
            body = {"prompt": [1000 + i, 7, 8], "max_tokens": 48, "temperature": 0}
            r = reference_server.post("/v1/completions", json={**body, "ignore_eos": True})
        elif i % 3 == 2:
            body = {"input": f"Say {i}", "max_output_tokens": 48, "temperature": 0}
            r = reference_server.post("/v1/responses", json=body)
        else:
            r = _generate(reference_server, [1000 + i, 7, 8], 48)
        return r, time.perf_counter() - t0

    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(send, range(n)))
    accepted = [(r, t) for r, t in results if r.status_code == 200]
    refused = [(r, t) for r, t in results if r.status_code != 200]
    assert len(accepted) + len(refused) == n
    assert len(accepted) >= 3 and refused, [r.status_code for r, _ in results]
    full = "The request queue is full."
    for r, _ in refused:
        assert r.status_code == 503
        if r.url.endswith("/v1/responses"):
            error = {"message": full, "type": "Service Unavailable", "param": None, "code": 503}
            assert r.json() == {"error": error}
        else:
            error = {"object": "error", "message": full, "type": "503", "param": None}
            assert r.json() == {**error, "code": 503}
    for r, _ in accepted:
        body = r.json()
        if "output_ids" in body:
            n_out = len(body["output_ids"])
        elif body.get("object") == "response":  # no ignore_eos here: EOS may end it early
            assert body["status"] in ("completed", "incomplete"), body
            assert 0 < body["usage"]["output_tokens"] <= 48
            continue
        else:
            n_out = body["usage"]["completion_tokens"]
        assert n_out == 48
    # Refusals did not wait for a turn: they came back before the accepted work finished.
    assert max(t for _, t in refused) < max(t for _, t in accepted)
    m = reference_server.wait_memory_all_free()
    assert m["failures"] == 0 and m["free"] == m["capacity"], m


def test_flush_cache_idle_and_busy(paged_server: ServerHandle, prompts) -> None:
    _generate(paged_server, prompts[0], 2)
    assert paged_server.wait_memory_all_free()["evictable"] > 0
    long, _lines = _stream_until_running(paged_server, "flush-busy", 400)
    busy = paged_server.post("/flush_cache")
    assert busy.status_code == 400 and busy.headers["content-type"].startswith("text/plain")
    paged_server.post("/abort_request", json={"rid": "flush-busy"})
    long.close()
    paged_server.wait_memory_all_free()
    idle = paged_server.post("/flush_cache")
    assert idle.status_code == 200 and idle.text.startswith("Cache flushed.")
    m = paged_server.memory_accounting()
    assert m["evictable"] == 0 and m["free"] == m["capacity"] and m["failures"] == 0, m
    # No hit after the flush.
    again = _generate(paged_server, prompts[0], 2)
    assert again.json()["meta_info"]["cached_tokens"] == 0

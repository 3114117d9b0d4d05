"""What a server tells its operator, as SGLang does: the resolved `server_args=ServerArgs(...)`
line, uvicorn's "Uvicorn running on http://host:port" line and its access log (uvicorn logs
at --log-level unless --log-level-http says otherwise), and its worker processes' titles in
ps (mini_sglang::scheduler, mini_sglang::detokenizer; SGLang's sglang::...)."""

from __future__ import annotations

import re
import time

import psutil

from tests.server.conftest import ServerHandle


def _wait_for_log(server: ServerHandle, pattern: str, timeout: float = 10) -> str:
    deadline = time.monotonic() + timeout
    while True:
        log = server.log()
        if re.search(pattern, log, re.M) or time.monotonic() > deadline:
            return log


def test_log_says_where_it_listens_and_what_it_runs(server: ServerHandle) -> None:
    log = server.log()
    assert re.search(r"^\[[-0-9: ]+\] server_args=ServerArgs\(model_path=", log, re.M), log[:3000]
    assert f"Uvicorn running on {server.base_url} (Press CTRL+C to quit)" in log, log[-3000:]
    # Each start-up phase says when it starts or how long it took; weights load with a bar.
    for pattern in (
        r"^\[[-0-9: ]+\] Load weight begin\. avail mem=\d+\.\d\d GB$",
        r"^Loading safetensors checkpoint shards: 100% Completed \| 1/1 \[",
        r"^\[[-0-9: ]+\] Load weight end\. .*elapsed=\d+\.\d\d s$",
        r"^\[[-0-9: ]+\] TokenizerManager ready in \d+\.\d s \(tokenizer: .*\)$",
        r"^\[[-0-9: ]+\] 2 child process\(es\) ready in \d+\.\d s$",
        r"^\[[-0-9: ]+\] Warm-up request done in \d+\.\d\d s$",
    ):
        assert re.search(pattern, log, re.M), (pattern, log[-3000:])
    assert server.get("/health").status_code == 200
    access = r'^\[[-0-9: ]+\] INFO: +127\.0\.0\.1:\d+ - "GET /health HTTP/1\.1" 200 OK$'
    log = _wait_for_log(server, access)
    assert re.search(access, log, re.M), log[-3000:]


def child_titles(server: ServerHandle) -> list[str]:
    """The titles of the server's worker processes (multiprocessing's helpers left out)."""
    titles = [" ".join(p.cmdline()).strip() for p in psutil.Process(server.proc.pid).children()]
    return sorted(t for t in titles if "resource_tracker" not in t)


def test_worker_processes_are_named(server: ServerHandle) -> None:
    assert child_titles(server) == ["mini_sglang::detokenizer", "mini_sglang::scheduler"]

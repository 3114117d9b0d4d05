"""Process lifecycle of `python -m mini_sglang.launch_server`: readiness (/health 503 then
200), clean shutdown on SIGTERM / SIGINT with no process left, a dead child taking the
server down promptly, a hung forward taking it down through the watchdog
(--watchdog-timeout), a bad --model-path failing fast, and two servers side by side.

Each test starts its own server(s) because each one ends them; they are the slow tests, so
checks that can share a server's life share one test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest
import requests

from tests.server.conftest import (
    STARTUP_TIMEOUT_S,
    ServerHandle,
    TinyModel,
    start_server,
    wait_ready,
)


def _greedy_ok(handle: ServerHandle) -> list[int]:
    r = handle.post(
        "/generate",
        json={"input_ids": [1, 2, 3], "sampling_params": {"temperature": 0, "max_new_tokens": 3}},
    )
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


def _exit_code(handle: ServerHandle, timeout: float, after: str) -> int:
    """The server's exit code, once it exits by itself; SIGKILL and fail after `timeout`."""
    try:
        return handle.proc.wait(timeout=timeout)
    except Exception:
        handle.stop(signal.SIGKILL)
        pytest.fail(f"server still running {timeout} s after {after}:\n{handle.log_tail()}")


def _health_until_ready(handle: ServerHandle) -> list[int]:
    """Poll /health as fast as possible from the server's start until it answers 200; the
    statuses seen, in order."""
    statuses: list[int] = []
    deadline = time.time() + STARTUP_TIMEOUT_S
    while time.time() < deadline:
        assert handle.proc.poll() is None, handle.log_tail()
        try:
            code = requests.get(handle.base_url + "/health", timeout=5).status_code
        except requests.RequestException:
            time.sleep(0.01)
            continue
        statuses.append(code)
        if code == 200:
            break
        time.sleep(0.005)
    return statuses


def test_two_servers_readiness_sigterm_sigint_and_served_model_name(
    tiny_model: TinyModel, server_logs: Path
):
    """Two servers side by side (the second with --served-model-name). The first answers
    /health 503 until its warm-up is done, then 200. SIGTERM stops the first (exit 0) and
    leaves the second serving; SIGINT stops the second; nothing of either is left."""
    a = start_server(tiny_model.path, log_dir=server_logs)
    b = start_server(tiny_model.path, "--served-model-name", "tiny-served", log_dir=server_logs)
    try:
        statuses = _health_until_ready(a)
        assert statuses and statuses[-1] == 200, (statuses, a.log_tail())
        # Before warm-up finished the server answered 503 (never 200 then 503, never 500).
        assert set(statuses[:-1]) <= {503}, statuses
        assert 503 in statuses, "never saw /health 503 during warm-up"
        assert "The server is fired up and ready to roll!" in a.log()
        assert requests.get(a.base_url + "/health", timeout=30).content == b""
        assert len(a.tree()) >= 3  # server + scheduler + detokenizer
        wait_ready(b)
        # Both answer, and identically (same weights, greedy).
        assert _greedy_ok(a) == _greedy_ok(b)
        assert a.get("/v1/models").json()["data"][0]["id"] == tiny_model.path
        card = b.get("/v1/models").json()["data"][0]
        assert card["id"] == "tiny-served" and card["root"] == "tiny-served"
        pids_a = {p.pid for p in a.tree()}
        pids_b = {p.pid for p in b.tree()}
        assert not pids_a & pids_b
    finally:
        rc_a = a.stop(signal.SIGTERM)
        # The other server is unaffected by the first one's shutdown.
        if b.proc.poll() is None:
            assert _greedy_ok(b)
        b.stop(signal.SIGINT)
    assert rc_a == 0


def _spawned_children(handle: ServerHandle) -> list[psutil.Process]:
    """The multiprocessing children (scheduler first: it is spawned before the detokenizer),
    by their command line, or by their title once they have set it."""
    kids = [
        p
        for p in psutil.Process(handle.proc.pid).children()
        if any(m in " ".join(p.cmdline()) for m in ("spawn_main", "mini_sglang::"))
    ]
    return sorted(kids, key=lambda p: (p.create_time(), p.pid))


def test_killed_scheduler_makes_server_exit_nonzero(tiny_model: TinyModel, server_logs: Path):
    handle = start_server(tiny_model.path, log_dir=server_logs)
    wait_ready(handle)
    kids = _spawned_children(handle)
    assert len(kids) == 2, kids
    handle.tree()  # remember every descendant for the no-orphans check in stop()
    kids[0].kill()
    assert _exit_code(handle, 30, "its scheduler died") != 0
    # An error line says which child died.
    assert "scheduler_TP0" in handle.log() and "died" in handle.log(), handle.log_tail()
    handle.stop()  # asserts nothing of the tree is left


def test_watchdog_takes_down_a_server_whose_forward_hangs(
    tiny_model: TinyModel, server_logs: Path, tmp_path: Path
):
    """A forward that never returns (made to hang, for prompts holding token 4242, by a
    sitecustomize every process of the server runs): after --watchdog-timeout the scheduler
    logs SGLang's "Watchdog timeout" line and the stack it hung in, and the server exits
    non-zero with nothing left; a normal request before it is served."""
    (tmp_path / "sitecustomize.py").write_text(
        "import time\n"
        "from mini_sglang.managers import tp_worker\n"
        "_forward = tp_worker.TpModelWorker.forward_batch_generation\n"
        "def _hang_on_4242(self, batch):\n"
        "    if bool((batch.input_ids == 4242).any()):\n"
        "        time.sleep(600)\n"
        "    return _forward(self, batch)\n"
        "tp_worker.TpModelWorker.forward_batch_generation = _hang_on_4242\n"
    )
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    handle = start_server(tiny_model.path, "--watchdog-timeout", "2", log_dir=server_logs, env=env)
    wait_ready(handle)
    handle.tree()  # remember every descendant for the no-orphans check in stop()
    assert len(_greedy_ok(handle)) == 3
    start = time.monotonic()
    with contextlib.suppress(requests.RequestException):  # the server goes away under it
        handle.post("/generate", json={"input_ids": [4242, 5], "sampling_params": {}}, timeout=60)
    assert _exit_code(handle, 60, "the watchdog timeout") != 0
    assert time.monotonic() - start < 60
    log = handle.log()
    assert "Watchdog timeout (self.watchdog_timeout=2.0)" in log, handle.log_tail()
    assert "in _hang_on_4242" in log, handle.log_tail()  # the hung thread's stack
    handle.stop()  # asserts nothing of the tree is left


def test_bad_model_path_exits_nonzero(server_logs: Path, tmp_path: Path):
    missing = str(tmp_path / "no_such_model")
    handle = start_server(missing, log_dir=server_logs)
    try:
        rc = handle.proc.wait(timeout=120)
    except Exception:
        handle.stop(signal.SIGKILL)
        pytest.fail(f"launch_server with a bad --model-path did not exit:\n{handle.log_tail()}")
    assert rc != 0
    # The last line says what is wrong, naming the path.
    last = handle.log().strip().splitlines()[-1]
    assert "no_such_model" in last, handle.log_tail()
    handle.stop()


ENGINE_TEARDOWN_SCRIPT = """
import sys, time
from mini_sglang.entrypoints import engine as engine_mod
from mini_sglang.utils import process

# Kill the TP ranks one at a time with a pause, as a slow teardown on a GPU does: rank 1
# sees rank 0 vanish mid-broadcast and sends SIGQUIT to this process.
real_kill = process.kill_process_tree
def slow_kill(pid, *a, **kw):
    real_kill(pid, *a, **kw)
    time.sleep(3)

if __name__ == "__main__":  # the scheduler processes are spawned and re-import this file
    engine_mod.kill_process_tree = slow_kill
    e = engine_mod.Engine(model_path=sys.argv[1], tp_size=2, max_total_tokens=2048)
    out = e.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2})
    e.shutdown()
    print("survived", len(out["output_ids"]), flush=True)
"""


def test_engine_tp2_shutdown_survives_rank_sigquit(tiny_model: TinyModel, tmp_path: Path):
    """Engine.shutdown with tp=2: a rank that fails because its peer was killed first must not
    take the parent down (on the H200 this lost bench_offline_throughput's result)."""
    import subprocess
    import sys

    script = tmp_path / "teardown.py"
    script.write_text(ENGINE_TEARDOWN_SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), tiny_model.path],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=str(Path(__file__).resolve().parents[2]),
    )
    assert proc.returncode == 0 and "survived 2" in proc.stdout, proc.stderr[-3000:]

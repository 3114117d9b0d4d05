"""Data parallelism and multi-node tensor parallelism on real servers (CPU, gloo).

- dp=2 (shortest_queue): greedy outputs equal transformers', requests spread over both
  replicas, `data_parallel_rank` pins a request, control requests (flush_cache, server
  info) reach every replica.
- Two "nodes" on one machine (two launch commands, tp=2, one rank per node, TP group at
  --dist-init-addr 127.0.0.1:<port>), with --load-format dummy: node 0 serves HTTP and its
  outputs equal a tp=1 scheduler's on the same dummy model (so the dummy fill is sharded
  from the tp=1 tensors); stopping both leaves no process.
- The shortest_queue budget and the controller's routing, without processes.
(tp=2 on one node is covered by test_weight_sync.py, whose server is tp=2.)
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from mini_sglang.managers.data_parallel_controller import DataParallelController, DPBudget
from mini_sglang.managers.io_struct.control import GetLoadReqOutput
from tests.server.conftest import (
    ServerHandle,
    TinyModel,
    _root_conftest,
    free_port,
    launch_server,
    start_server,
)


def _generate(handle: ServerHandle, ids, n: int = 8, **extra) -> dict | list:
    r = handle.post(
        "/generate",
        json={
            "input_ids": ids,
            "sampling_params": {"temperature": 0, "max_new_tokens": n, "ignore_eos": True},
            **extra,
        },
    )
    assert r.status_code == 200, r.text
    return r.json()


def _prefills(handle: ServerHandle, dp_rank: int) -> int:
    return len(re.findall(rf"DP{dp_rank}\] Prefill batch", handle.log()))


# ---- dp=2 ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dp2_server(tiny_model: TinyModel, server_logs: Path) -> Iterator[ServerHandle]:
    handle = launch_server(
        tiny_model.path,
        "--dp-size",
        "2",
        "--load-balance-method",
        "shortest_queue",
        log_dir=server_logs,
    )
    yield handle
    handle.stop()


def test_dp2_greedy_matches_transformers_on_both_replicas(dp2_server, tiny_model):
    before = [_prefills(dp2_server, r) for r in (0, 1)]
    outs = _generate(dp2_server, [tiny_model.eos_prompt_ids] * 4)
    assert [o["output_ids"] for o in outs] == [tiny_model.greedy_ids[:8]] * 4
    after = [_prefills(dp2_server, r) for r in (0, 1)]
    assert all(a > b for a, b in zip(after, before)), (before, after)


def test_dp2_data_parallel_rank_pins_and_control_reaches_all(dp2_server, tiny_model):
    before = [_prefills(dp2_server, r) for r in (0, 1)]
    for i in range(3):
        out = _generate(dp2_server, tiny_model.eos_prompt_ids[: 3 + i], n=2, data_parallel_rank=1)
        assert len(out["output_ids"]) == 2
    after = [_prefills(dp2_server, r) for r in (0, 1)]
    assert after[0] == before[0] and after[1] == before[1] + 3, (before, after)
    r = dp2_server.post("/flush_cache")
    assert r.status_code == 200, r.text
    assert len(re.findall(r"DP\d\] Cache flushed successfully", dp2_server.log())) >= 2
    info = dp2_server.get("/get_server_info").json()
    assert info["dp_size"] == 2 and info["internal_states"][0]["max_total_num_tokens"] > 0


def test_dp2_worker_process_titles(dp2_server):
    from tests.server.test_startup_output import child_titles

    assert child_titles(dp2_server) == [
        "mini_sglang::data_parallel_controller",
        "mini_sglang::detokenizer",
        "mini_sglang::scheduler_DP0",
        "mini_sglang::scheduler_DP1",
    ]


def test_dp2_control_replies_list_every_replica(dp2_server, tiny_model):
    """Server info (with each replica's memory accounting and idle-check failures) and
    /get_load list both replicas, each with its own state, not replica 0's twice."""
    # Pin a request that holds KV to replica 1 while the states are read.
    body = {"input_ids": tiny_model.eos_prompt_ids, "data_parallel_rank": 1, "stream": True}
    body["sampling_params"] = {"max_new_tokens": 400, "ignore_eos": True}
    r = requests.post(dp2_server.base_url + "/generate", json=body, stream=True, timeout=60)
    try:
        # One line iterator, kept alive: a discarded one closes the response (a disconnect,
        # which aborts the request before the states are read).
        lines = r.iter_lines()
        next(line for line in lines if line.startswith(b"data: {"))
        states = dp2_server.get("/get_server_info").json()["internal_states"]
        loads = dp2_server.get("/get_load").json()
    finally:
        r.close()
    assert len(states) == 2
    for state in states:
        assert state["memory_check_failures"] == 0 and state["max_total_num_tokens"] > 0
    busy = [s["memory_accounting"]["req_slots"] - s["memory_accounting"]["free_req_slots"]
            for s in states]  # fmt: skip
    assert busy == [0, 1], busy  # only replica 1 holds the running request
    assert [load["dp_rank"] for load in loads] == [0, 1]
    assert set(loads[0]) == {"dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens"}
    assert loads[0]["num_reqs"] == 0 and loads[1]["num_reqs"] == 1, loads


def test_dp2_dashboard_merges_every_replica(dp2_server, tiny_model):
    """/dashboard/data sums both replicas and keeps each one's numbers."""
    assert dp2_server.post("/slow_down", json={"forward_sleep_time": 0.05}).ok
    body = {"input_ids": tiny_model.eos_prompt_ids, "data_parallel_rank": 1, "stream": True}
    body["sampling_params"] = {"max_new_tokens": 100, "ignore_eos": True}
    r = requests.post(dp2_server.base_url + "/generate", json=body, stream=True, timeout=60)
    try:
        # One line iterator, kept alive: a discarded one closes the response (a disconnect).
        lines = r.iter_lines()
        next(line for line in lines if line.startswith(b"data: {"))
        dash = dp2_server.get("/dashboard/data").json()
        states = dp2_server.get("/get_server_info").json()["internal_states"]
    finally:
        r.close()
        dp2_server.post("/slow_down", json={"forward_sleep_time": None})
    sch = dash["scheduler"]
    assert [rep["num_running_reqs"] for rep in sch["replicas"]] == [0, 1], sch
    assert sch["num_running_reqs"] == 1 and sch["replicas"][1]["kv"]["used"] > 0
    assert sch["kv"]["capacity"] == sum(s["memory_accounting"]["capacity"] for s in states)
    assert dash["server"]["dp_size"] == 2 and dash["inflight"]["count"] == 1


# ---- two nodes ----------------------------------------------------------------------
def test_two_nodes_tp2_dummy_weights(tiny_model: TinyModel, server_logs: Path):
    dist_addr = f"127.0.0.1:{free_port()}"
    common = ["--tp-size", "2", "--nnodes", "2", "--dist-init-addr", dist_addr]
    common += ["--load-format", "dummy"]
    node1 = start_server(
        tiny_model.path, *common, "--node-rank", "1", log_dir=server_logs, port=free_port()
    )
    node0 = None
    try:
        node0 = launch_server(tiny_model.path, *common, "--node-rank", "0", log_dir=server_logs)
        # Node 1 runs only its scheduler (and a dummy /health); node 0 serves.
        assert requests.get(f"{node1.base_url}/health", timeout=10).status_code == 200
        assert "TP1" in node1.log() and "TP0" not in node1.log()
        prompts = [tiny_model.eos_prompt_ids, [3, 1, 4, 1, 5, 9]]
        outs = _generate(node0, prompts, n=6)
        root = _root_conftest()
        sched = root.make_scheduler(tiny_model.path, load_format="dummy")
        ref = root.run_prompts(sched, prompts, 6)
        assert [o["output_ids"] for o in outs] == [r.output_ids for r in ref]
    finally:
        if node0 is not None:
            node0.stop()
        # Node 1's scheduler loses its peer; it exits by itself or on SIGTERM.
        node1.stop()


# ---- routing without processes ------------------------------------------------------
def test_dp_budget_fills_the_least_loaded_first():
    budget = DPBudget()
    loads = [GetLoadReqOutput(dp_rank=i, num_reqs=n, num_waiting_reqs=0, num_tokens=0)
             for i, n in enumerate([3, 1, 0])]  # fmt: skip
    budget.update_budget(loads)
    assert [budget.dispatch() for _ in range(6)] == [2, 1, 2, 1, 2, None]
    budget.update_budget([GetLoadReqOutput(i, 2, 0, 0) for i in range(2)])
    assert budget.dispatch() is None


def test_controller_round_robin_and_pinning(tmp_path: Path):
    from mini_sglang.server_args import ServerArgs

    args = ServerArgs(model_path=str(tmp_path), device="cpu", dp_size=3)
    ipc = [f"ipc://{tmp_path}/in{i}" for i in range(4)]
    ctrl = DataParallelController(args, ipc[0], ipc[1:])
    req = _root_conftest().make_req("r", [1, 2], 1, True)
    assert [ctrl.pick_replica(req) for _ in range(4)] == [0, 1, 2, 0]
    req.data_parallel_rank = 2
    assert ctrl.pick_replica(req) == 2
    ctrl.context.destroy(linger=0)

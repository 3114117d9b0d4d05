"""bench_one_batch on CPU: a batch larger than --max-prefill-tokens prefills in groups,
decodes as one batch, and returns every KV slot afterwards."""

from __future__ import annotations

import json

import pytest

from mini_sglang.bench_one_batch import _prefill_groups, main
from mini_sglang.managers.req import Req
from mini_sglang.sampling.sampling_params import SamplingParams
from tests.conftest import wait_until_gone


def _req(n: int) -> Req:
    return Req("r", "", [1] * n, SamplingParams(max_new_tokens=1), vocab_size=10)


@pytest.mark.parametrize(
    "lens, budget, sizes",
    [
        ([6000] * 5, 16384, [2, 2, 1]),
        ([100, 100, 100], 16384, [3]),
        ([20000, 10, 10], 16384, [1, 2]),  # an over-long prompt still gets a group
        ([10, 20000, 10], 16384, [1, 1, 1]),
    ],
)
def test_prefill_groups_respect_the_token_budget(lens, budget, sizes):
    groups = _prefill_groups([_req(n) for n in lens], budget)
    assert [len(g) for g in groups] == sizes
    assert [len(r.origin_input_ids) for g in groups for r in g] == lens


def test_grouped_prefill_runs_and_frees_everything(tiny_llama_path: str):
    # Each run holds 5 x (40 + 6) = 230 of the 400 slots: the second run only fits if the
    # first one (prefilled in groups of 2, 2, 1, decoded as one batch) gave all of them back.
    out = main(
        [
            "--model-path", tiny_llama_path, "--device", "cpu", "--dtype", "float32",
            "--batch-size", "5", "5", "--input-len", "40", "--output-len", "6",
            "--max-prefill-tokens", "90", "--max-total-tokens", "400",
        ]
    )  # fmt: skip
    assert [r["batch_size"] for r in out["results"]] == [5, 5]
    assert all(r["mean_decode_ms"] > 0 for r in out["results"])


def test_scheduler_mode_sync_debug_on_cpu_says_it_needs_cuda(tiny_llama_path: str, capsys):
    out = main(
        [
            "--model-path", tiny_llama_path, "--device", "cpu", "--dtype", "float32",
            "--mode", "scheduler", "--sync-debug", "--batch-size", "2", "--input-len", "8",
            "--output-len", "4",
        ]
    )  # fmt: skip
    assert "--sync-debug needs a CUDA device" in capsys.readouterr().out
    assert [r["batch_size"] for r in out["results"]] == [2]


def test_profile_writes_the_kernel_table_and_the_trace(tiny_llama_path: str, tmp_path):
    """--profile PATH: the torch.profiler table at PATH and the timeline that
    benchmarks/trace_kernel_summary.py reads at PATH.trace.json (CPU ops only here)."""
    path = tmp_path / "p.txt"
    main(
        [
            "--model-path", tiny_llama_path, "--device", "cpu", "--dtype", "float32",
            "--batch-size", "1", "--input-len", "8", "--output-len", "4", "--profile", str(path),
        ]
    )  # fmt: skip
    assert "Self CPU" in path.read_text()
    trace = json.loads((tmp_path / "p.txt.trace.json").read_text())
    assert {"aten::mm", "aten::addmm"} & {e.get("name") for e in trace["traceEvents"]}


def test_tp_size_2_runs_one_process_per_rank(tiny_llama_path: str, tmp_path):
    """--tp-size 2 starts two gloo ranks that run the batches in lockstep (the row's tp_size
    is what the model saw); rank 0 alone writes the result file. Scheduler mode here; the
    runner mode's two-rank run is the teardown test's below (each launch costs seconds)."""
    result_file = tmp_path / "rows.jsonl"
    out = main(
        [
            "--model-path", tiny_llama_path, "--device", "cpu", "--dtype", "float32",
            "--tp-size", "2", "--mode", "scheduler", "--batch-size", "2", "--input-len", "8",
            "--output-len", "4", "--result-filename", str(result_file),
        ]
    )  # fmt: skip
    assert [(r["batch_size"], r["tp_size"]) for r in out["results"]] == [(2, 2)]
    assert len(result_file.read_text().splitlines()) == 1


def test_tp_size_error_on_a_rank_is_raised(tiny_llama_path: str):
    # 3 ranks cannot split the tiny model's 4 heads: every rank fails at start-up, and the
    # error names the rank instead of leaving the parent waiting.
    with pytest.raises(RuntimeError, match="TP rank"):
        main(
            [
                "--model-path", tiny_llama_path, "--device", "cpu", "--dtype", "float32",
                "--tp-size", "3", "--batch-size", "1", "--input-len", "4", "--output-len", "2",
            ]
        )  # fmt: skip


def test_tp_ranks_die_with_the_benchmark(tiny_llama_path: str):
    """Killing bench_one_batch (a timeout, Ctrl-C twice) takes its rank processes with it,
    instead of leaving them running on the devices."""
    import signal
    import subprocess
    import sys
    import time

    import psutil

    cmd = [
        sys.executable,
        "-m",
        "mini_sglang.bench_one_batch",
        "--model-path",
        tiny_llama_path,
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--tp-size",
        "2",
        "--input-len",
        "8",
        "--output-len",
        "200",
        "--batch-size",
        *["1"] * 5000,
    ]  # fmt: skip  (5000 runs of 200 steps: far longer than the test)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ranks: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(ranks) < 2:
            time.sleep(0.5)
            children = psutil.Process(proc.pid).children()
            ranks = [c for c in children if "spawn_main" in " ".join(c.cmdline())]
        assert len(ranks) == 2, "the rank processes did not start"
        time.sleep(3)  # let them get into the model
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        alive = wait_until_gone(ranks, timeout=30)
        assert not alive, f"rank processes outlived the benchmark: {[p.pid for p in alive]}"
    finally:
        proc.kill()
        for rank in ranks:
            if rank.is_running():
                rank.kill()


def test_tp_rank_stuck_leaving_the_group_is_killed_after_its_report(tiny_llama_path, tmp_path):
    """A rank whose group teardown never returns does not hold the benchmark: its numbers
    are already reported (runner mode, --tp-size 2: the two ranks ran the batch of 2 in
    lockstep, the row's tp_size is what the model saw, rank 0 alone wrote the result file),
    the rank's stack is in the log after half of TEARDOWN_TIMEOUT_S, and the parent kills
    it after TEARDOWN_TIMEOUT_S. (NCCL's teardown waits for CUDA graphs
    that captured its collectives, so the ranks destroy them first, which
    tests/gpu/test_gpu_tp.py checks; this guards against any other such hang.) The
    teardown is made to hang in the rank processes by a sitecustomize that every interpreter
    started here runs."""
    import os
    import subprocess
    import sys
    import time

    (tmp_path / "sitecustomize.py").write_text(
        "import time\n"
        "import mini_sglang.distributed.parallel_state as ps\n"
        "ps.destroy_distributed_environment = lambda: time.sleep(600)\n"
        "import mini_sglang.benchmark.tp_group as tp_group\n"
        "tp_group.TEARDOWN_TIMEOUT_S = 2\n"
    )
    result_file = tmp_path / "rows.jsonl"
    argv = [
        "--model-path", tiny_llama_path, "--device", "cpu", "--dtype", "float32",
        "--tp-size", "2", "--batch-size", "2", "--input-len", "8", "--output-len", "4",
        "--result-filename", str(result_file),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", f"from mini_sglang.bench_one_batch import main; main({argv!r})"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("still leaving the group; killed") == 2, proc.stderr[-3000:]
    # each rank's stack, dumped while it hung, points at the teardown it is stuck in
    assert proc.stderr.count("Timeout (0:00:01)!") == 2, proc.stderr[-3000:]
    assert 'sitecustomize.py", line 3 in <lambda>' in proc.stderr, proc.stderr[-3000:]
    rows = [json.loads(line) for line in result_file.read_text().splitlines()]
    assert [(r["batch_size"], r["tp_size"]) for r in rows] == [(2, 2)]
    assert time.monotonic() - start < 100  # not the rank's 600 s

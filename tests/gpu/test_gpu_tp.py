"""Tensor parallelism over NCCL on two GPUs: a tp=2 server (one Scheduler process per GPU,
row-parallel all-reduce and vocab-parallel embedding / LM head over NCCL, CUDA graphs on)
returns top-5 logprobs within 5e-2 of HF transformers in bf16 at every prompt position and
over 16 decode steps, for page size 1 and 16, and leaves the pool whole.

Skipped with fewer than two GPUs (run on a 2-GPU device kind).
"""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch

from tests.gpu.test_gpu_correctness import TOL, _build_gpu_tiny_model
from tests.server.conftest import GPU_STARTUP_TIMEOUT_S, ServerHandle, launch_server

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"
)

DECODE_STEPS = 16


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def tp_model(request, tmp_path_factory, qwen_tokenizer):
    out = tmp_path_factory.mktemp(f"tp_{request.param}")
    hf = _build_gpu_tiny_model(request.param, out, qwen_tokenizer)
    hf = hf.to(device="cuda:0", dtype=torch.bfloat16)
    yield str(out), hf
    del hf
    gc.collect()
    torch.cuda.empty_cache()


@pytest.fixture(params=[1, 16])
def tp2_server(request, tp_model, tmp_path_factory) -> Iterator[ServerHandle]:
    path, _ = tp_model
    handle = launch_server(
        path,
        "--tp-size",
        "2",
        "--dtype",
        "bfloat16",
        "--page-size",
        str(request.param),
        "--mem-fraction-static",
        "0.5",
        log_dir=tmp_path_factory.mktemp("tp2_logs"),
        max_total_tokens=8192,
        startup_timeout=GPU_STARTUP_TIMEOUT_S,
    )
    yield handle
    handle.stop()


def test_tp2_nccl_top5_logprobs_match_hf(tp2_server: ServerHandle, tp_model) -> None:
    _, hf = tp_model
    prompts = [list(range(100, 100 + n)) for n in (5, 33, 64)]
    body = {
        "input_ids": prompts,
        "sampling_params": {"temperature": 0, "max_new_tokens": DECODE_STEPS, "ignore_eos": True},
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": 5,
    }
    r = tp2_server.post("/generate", json=body)
    assert r.status_code == 200, r.text
    worst = 0.0
    for ids, out in zip(prompts, r.json()):
        gen = out["output_ids"]
        assert len(gen) == DECODE_STEPS
        meta = out["meta_info"]
        with torch.no_grad():
            logits = hf(torch.tensor([ids + gen], device="cuda:0")).logits[0].float()
        ref = torch.log_softmax(logits, -1).cpu()
        for k, top in enumerate(meta["input_top_logprobs"]):
            if top is None:
                continue
            got = torch.tensor([t[0] for t in top])
            worst = max(worst, float((got - ref[k - 1, [t[1] for t in top]]).abs().max()))
        for s, top in enumerate(meta["output_top_logprobs"]):
            got = torch.tensor([t[0] for t in top])
            row = ref[len(ids) - 1 + s]
            worst = max(worst, float((got - row[[t[1] for t in top]]).abs().max()))
    assert worst <= TOL, f"max top-5 logprob diff {worst:.4f} > {TOL}"
    info = tp2_server.get("/get_server_info").json()
    assert info["tp_size"] == 2 and info["device"] == "cuda"
    m = tp2_server.wait_memory_all_free()
    assert m["failures"] == 0


def test_bench_one_batch_tp2_ranks_leave_the_nccl_group(tp_model) -> None:
    """bench_one_batch --tp-size 2 with CUDA graphs over NCCL returns its numbers and its
    ranks leave the group on their own: with the graphs alive, destroy_process_group never
    returned and the parent killed both ranks after 60 s ("still leaving the group")."""
    path, _ = tp_model
    cmd = [
        sys.executable, "-m", "mini_sglang.bench_one_batch", "--model-path", path,
        "--dtype", "bfloat16", "--tp-size", "2", "--batch-size", "1", "--input-len", "16",
        "--output-len", "8", "--cuda-graph-max-bs", "2", "--mem-fraction-static", "0.5",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=GPU_STARTUP_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Decode.  mean ms/token" in proc.stdout
    assert "still leaving the group" not in proc.stderr, proc.stderr[-3000:]
    assert "Timeout" not in proc.stderr, proc.stderr[-3000:]  # no faulthandler dump either

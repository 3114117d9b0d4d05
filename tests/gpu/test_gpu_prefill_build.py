"""GPU: while flashinfer's batch-prefill module builds in the background (a fresh start,
ModelRunner.start_flashinfer_builds), prefill runs Triton's extend kernel; once it is built,
flashinfer's. Both give top-5 logprobs within TOL of HF (test_gpu_correctness.py's check),
with the small-decode Triton backend serving as the fallback and, where small decodes stay on
flashinfer, a Triton backend of its own.

The build is forced "in flight" by registering an unset event under the module's name
before the scheduler starts (the input of the switch: a module already in that registry
is not built again), and "ended" by setting it.

Skipped without CUDA; run on the GPU machine by scripts/run_gpu_suite.sh.
"""

from __future__ import annotations

import gc
import threading

import pytest
import torch

from tests.gpu.test_gpu_correctness import (
    HfReference,
    _backend_available,
    _build_gpu_tiny_model,
    _check_top5_against_hf,
    _make_gpu_scheduler,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def llama(tmp_path_factory, qwen_tokenizer):
    """(model dir, HfReference) of a tiny Llama (head_dim 64, bf16)."""
    out = tmp_path_factory.mktemp("gpu_prefill_build")
    hf = _build_gpu_tiny_model("llama", out, qwen_tokenizer)
    yield str(out), HfReference(hf.to(device="cuda", dtype=torch.bfloat16))
    gc.collect()
    torch.cuda.empty_cache()


@pytest.mark.parametrize(
    "backends",
    [
        dict(attention_backend="flashinfer"),  # small decodes on Triton: that side serves
        dict(prefill_attention_backend="flashinfer", decode_attention_backend="flashinfer"),
    ],
    ids=["small-decode-triton", "all-flashinfer"],
)
def test_prefill_runs_triton_until_flashinfer_prefill_is_built(llama, backends, monkeypatch):
    if not _backend_available("flashinfer"):
        pytest.skip("flashinfer not installed")
    from mini_sglang.layers import kernels
    from mini_sglang.layers.attention.flashinfer_backend import (
        FlashInferAttnBackend,
        batch_prefill_spec,
    )
    from mini_sglang.layers.attention.triton_backend import TritonAttnBackend

    model_path, hf = llama
    name = batch_prefill_spec(torch.bfloat16, torch.bfloat16, 64, torch.device("cuda")).name
    built = threading.Event()
    monkeypatch.setitem(kernels._builds, name, built)
    monkeypatch.delenv("MINI_SGLANG_DISABLE_BACKGROUND_FLASHINFER_BUILD", raising=False)
    sched, outputs = _make_gpu_scheduler(model_path, **backends)
    runner = sched.tp_worker.model_runner
    be = runner.attn_backend
    assert runner.prefill_build == name
    assert isinstance(be.prefill_fallback, TritonAttnBackend)
    small = be.small_decode_backend
    assert (be.prefill_fallback is small) == ("attention_backend" in backends)

    sides: list[object] = []
    plan = be.init_forward_metadata

    def record(fb):
        plan(fb)
        if not fb.forward_mode.is_decode():
            sides.append(be.extend_backend)

    be.init_forward_metadata = record
    _check_top5_against_hf(sched, outputs, hf)
    assert sides and all(isinstance(s, TritonAttnBackend) for s in sides)

    built.set()
    outputs.clear()
    sides.clear()
    _check_top5_against_hf(sched, outputs, hf)
    assert sides and all(isinstance(s, FlashInferAttnBackend) for s in sides)
    assert be.prefill_fallback is None and be.small_decode_backend is small

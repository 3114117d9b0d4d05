"""GPU: a tiny Qwen2.5-VL in bf16 against transformers in bf16 on every attention backend,
CUDA graphs on and off: top-5 logprobs within 5e-2 (SGLang's tolerance) at every prompt
position (image rows included) and over 32 decode steps (M-RoPE decode positions through
the fused RoPE kernels and the graphs), for prompts with 0, 1 and 2 images batched
together; plus chunked prefill splitting the images, mixed with running decodes; and
--tp-size 2 on two GPUs (decoder sharded, vision tower replicated).

Skipped without CUDA; run on the GPU machine by scripts/run_gpu_suite.sh (tests, vlm).
"""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch

from tests.conftest import make_req
from tests.gpu.test_gpu_correctness import (
    BACKENDS,
    TOL,
    _backend_kwargs,
    _collect_top_logprobs,
    _make_gpu_scheduler,
)
from tests.tiny_qwen2_5_vl import build_prompts, build_tiny_qwen2_5_vl, hf_inputs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

DECODE_STEPS = 32


@pytest.fixture(scope="module")
def vl(tmp_path_factory, qwen_tokenizer):
    """(model dir, transformers model in bf16 on CUDA, processed prompts). head_dim 64 (what
    flashinfer needs), mrope_section [8, 12, 12], initializer_range 0.02 so bf16 can hold
    the logits (see test_gpu_correctness._build_gpu_tiny_model)."""
    from transformers import AutoConfig, AutoImageProcessor

    from mini_sglang.multimodal.processors import TokenizerAndImageProcessor
    from mini_sglang.multimodal.processors.qwen_vl import QwenVLImageProcessor

    path = tmp_path_factory.mktemp("gpu_qwen2_5_vl")
    hf = build_tiny_qwen2_5_vl(
        path,
        qwen_tokenizer,
        hidden_size=256,
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_scaling={"type": "mrope", "mrope_section": [8, 12, 12]},
        initializer_range=0.02,
    )
    parts = TokenizerAndImageProcessor(qwen_tokenizer, AutoImageProcessor.from_pretrained(path))
    processor = QwenVLImageProcessor(AutoConfig.from_pretrained(str(path)), None, parts)
    prompts = [processed for _, _, processed in build_prompts(processor)]
    hf = hf.to(device="cuda", dtype=torch.bfloat16)
    yield str(path), hf, prompts
    del hf
    gc.collect()
    torch.cuda.empty_cache()


@torch.no_grad()
def _hf_logprobs(hf, processed: dict, output_ids: list[int]) -> torch.Tensor:
    """transformers' log-softmax at every position of prompt + output (with the images)."""
    full = dict(processed, input_ids=processed["input_ids"] + output_ids)
    kw = {k: v.to(hf.device) for k, v in hf_inputs(hf, full).items()}
    if "pixel_values" in kw:
        kw["pixel_values"] = kw["pixel_values"].to(hf.dtype)
    hf.model.rope_deltas = None
    return torch.log_softmax(hf(**kw).logits[0].float(), dim=-1)


def _check_top5(sched, outputs: list, hf, prompts: list[dict]) -> None:
    for i, p in enumerate(prompts):
        extra: dict[str, Any] = {}
        if p.get("mm_items"):
            extra["mm_inputs"] = {k: v for k, v in p.items() if k != "input_ids"}
        req = make_req(
            f"v{i}",
            p["input_ids"],
            DECODE_STEPS,
            True,
            return_logprob=True,
            logprob_start_len=0,
            top_logprobs_num=5,
            **extra,
        )
        sched.add_request(req)
    sched.run_until_idle()
    per_rid = _collect_top_logprobs(outputs)
    worst = 0.0
    for i, p in enumerate(prompts):
        d = per_rid[f"v{i}"]
        assert len(d["out"]) == DECODE_STEPS
        ref = _hf_logprobs(hf, p, d["out"])
        n = len(p["input_ids"])
        rows = [(k - 1, v, idx) for k, (v, idx) in enumerate(d["in_top"]) if v is not None]
        rows += [(n - 1 + s, v, idx) for s, (v, idx) in enumerate(d["out_top"])]
        for row, vals, idx in rows:
            want = ref[row, torch.tensor(idx, device=ref.device)].cpu()
            worst = max(worst, float((torch.tensor(vals) - want).abs().max()))
    assert worst <= TOL, f"top-5 logprobs differ from transformers by up to {worst:.4f}"
    m = sched.stats.memory_accounting()
    assert m["protected"] == 0 and m["free"] + m["evictable"] == m["capacity"], m


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("graphs", [True, False])
def test_top5_logprobs_match_hf(vl, backend: str, graphs: bool) -> None:
    path, hf, prompts = vl
    sched, outputs = _make_gpu_scheduler(
        path, disable_cuda_graph=not graphs, **_backend_kwargs(backend)
    )
    _check_top5(sched, outputs, hf, prompts)


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunked_mixed_top5_logprobs_match_hf(vl, backend: str) -> None:
    """Chunks of 8 tokens split every image; --enable-mixed-chunk runs them beside the
    decodes of the requests already running."""
    path, hf, prompts = vl
    sched, outputs = _make_gpu_scheduler(
        path, chunked_prefill_size=8, enable_mixed_chunk=True, **_backend_kwargs(backend)
    )
    _check_top5(sched, outputs, hf, prompts)


def _rank_generate(server_args, prompts: list[dict], tp_rank: int) -> list[tuple[list, list]]:
    """On one TP rank (device tp_rank): each prompt's greedy tokens and their logprobs."""
    from mini_sglang.managers.scheduler import Scheduler
    from tests.conftest import collect_outputs

    outputs: list = []
    sched = Scheduler(
        server_args, tp_rank=tp_rank, gpu_id=tp_rank, send_to_detokenizer=outputs.append
    )
    for i, p in enumerate(prompts):
        mm = {k: v for k, v in p.items() if k != "input_ids"} or None
        sched.add_request(
            make_req(f"t{i}", p["input_ids"], DECODE_STEPS, True, mm_inputs=mm, return_logprob=True)
        )
    sched.run_until_idle()
    results = collect_outputs(outputs)
    return [
        (results[f"t{i}"].output_ids, results[f"t{i}"].output_logprobs) for i in range(len(prompts))
    ]


def check_tp2(path: str, hf, prompts: list[dict], device: str, tol: float) -> None:
    """--tp-size 2 (decoder sharded, vision tower replicated on each rank): every generated
    token's logprob within tol of transformers on the same sequence."""
    from mini_sglang.benchmark.tp_group import run_tp_group
    from mini_sglang.server_args import ServerArgs

    kw = dict(mem_fraction_static=0.5, dtype="bfloat16") if device == "cuda" else {}
    args = ServerArgs(
        model_path=path, device=device, tp_size=2, chunked_prefill_size=8,
        max_total_tokens=4096, max_running_requests=8, random_seed=0, **kw,
    )  # fmt: skip
    results = run_tp_group(_rank_generate, args, prompts)
    for i, (p, (out_ids, logprobs)) in enumerate(zip(prompts, results)):
        assert len(out_ids) == DECODE_STEPS
        ref = _hf_logprobs(hf, p, out_ids)
        n = len(p["input_ids"])
        want = ref[torch.arange(n - 1, n - 1 + len(out_ids)), torch.tensor(out_ids)].cpu()
        diff = (torch.tensor(logprobs) - want).abs().max().item()
        assert diff <= tol, f"prompt {i}: {diff}"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_tp2_logprobs_match_hf(vl) -> None:
    path, hf, prompts = vl
    check_tp2(path, hf, prompts, "cuda", TOL)

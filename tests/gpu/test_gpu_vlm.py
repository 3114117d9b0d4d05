"""GPU: a tiny random LLaVA (CLIP tower + Llama with head_dim 64, bf16) on every attention
backend, CUDA graphs on and off: the logprob of every generated token (prompt images
through prefill, then 16 decode steps) within 5e-2 of transformers in bf16 on the same
sequence, for image requests batched with a text-only one, with a chunk size that splits
an image's placeholder run; and with --tp-size 2 on two GPUs (projector split column /
row parallel, the language model sharded, the vision tower replicated).

Skipped without CUDA; run on the GPU machine by scripts/run_gpu_suite.sh (tests).
"""

from __future__ import annotations

import gc
import os

import pytest
import torch

from tests.conftest import collect_outputs, make_req
from tests.tiny_vlm import IMAGE_TOKEN, build_tiny_llava, make_image

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

TOL = 5e-2
MAX_NEW = 16
BACKENDS = os.environ.get("MINI_SGLANG_GPU_TEST_BACKENDS", "flashinfer,triton").split(",")
CASES = [
    (f"Describe {IMAGE_TOKEN} briefly.", [(40, 30, 1)]),
    (f"{IMAGE_TOKEN}{IMAGE_TOKEN} Compare the two pictures.", [(64, 64, 2), (20, 48, 3)]),
    ("A text-only prompt between image ones", []),
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, qwen_tokenizer):
    """(model dir, bf16 HF model on CUDA, our processor)."""
    from transformers import AutoConfig, AutoProcessor

    from mini_sglang.multimodal.processors import get_mm_processor

    path = str(tmp_path_factory.mktemp("gpu_llava"))
    # flashinfer needs head_dim >= 64; initializer_range 0.02 keeps bf16 logits comparable.
    hf = build_tiny_llava(
        path,
        qwen_tokenizer,
        text_overrides=dict(
            hidden_size=256, intermediate_size=512, head_dim=64, initializer_range=0.02
        ),
    )
    hf = hf.to(device="cuda", dtype=torch.bfloat16)
    processor = get_mm_processor(
        AutoConfig.from_pretrained(path), None, AutoProcessor.from_pretrained(path)
    )
    yield path, hf, processor
    del hf
    gc.collect()
    torch.cuda.empty_cache()


def _inputs(processor, case):
    text, sizes = case
    if not sizes:
        return processor.tokenizer.encode(text), None
    out = processor.process_mm_data([make_image(*s) for s in sizes], text, None)
    return out["input_ids"], out


@torch.no_grad()
def _hf_token_logprobs(hf, ids, mm, out_ids) -> torch.Tensor:
    seq = torch.tensor([ids + out_ids], device="cuda")
    kw = {}
    if mm is not None:
        pixels = torch.cat([item.feature for item in mm["mm_items"]])
        kw["pixel_values"] = pixels.to("cuda", torch.bfloat16)
    logits = hf(input_ids=seq, **kw).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    rows = logprobs[len(ids) - 1 : len(ids) - 1 + len(out_ids)]
    return rows.gather(1, torch.tensor(out_ids, device="cuda")[:, None])[:, 0].cpu()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("graphs", [True, False])
def test_vlm_logprobs_match_hf(tiny, backend, graphs):
    from mini_sglang.managers.scheduler import Scheduler
    from mini_sglang.server_args import ServerArgs

    if backend == "flashinfer":
        pytest.importorskip("flashinfer")
    path, hf, processor = tiny
    args = ServerArgs(
        model_path=path,
        device="cuda",
        dtype="bfloat16",
        attention_backend=backend,
        disable_cuda_graph=not graphs,
        cuda_graph_max_bs=8,
        chunked_prefill_size=24,
        max_total_tokens=4096,
        max_running_requests=8,
        mem_fraction_static=0.5,
        random_seed=0,
    )
    outputs: list = []
    sched = Scheduler(args, send_to_detokenizer=outputs.append)
    inputs = [_inputs(processor, c) for c in CASES]
    for i, (ids, mm) in enumerate(inputs):
        sched.add_request(make_req(f"r{i}", ids, MAX_NEW, True, mm_inputs=mm, return_logprob=True))
    sched.run_until_idle()
    results = collect_outputs(outputs)
    for i, (ids, mm) in enumerate(inputs):
        res = results[f"r{i}"]
        assert len(res.output_ids) == MAX_NEW
        ref = _hf_token_logprobs(hf, ids, mm, res.output_ids)
        got = torch.tensor(res.output_logprobs)
        diff = (got - ref).abs().max().item()
        assert diff < TOL, f"request {i}: {diff}"
    del sched
    gc.collect()
    torch.cuda.empty_cache()


def _rank_generate(server_args, inputs, tp_rank: int):
    """On one TP rank (GPU tp_rank): every input's greedy tokens and their logprobs."""
    from mini_sglang.managers.scheduler import Scheduler

    outputs: list = []
    sched = Scheduler(
        server_args, tp_rank=tp_rank, gpu_id=tp_rank, send_to_detokenizer=outputs.append
    )
    for i, (ids, mm) in enumerate(inputs):
        sched.add_request(make_req(f"r{i}", ids, MAX_NEW, True, mm_inputs=mm, return_logprob=True))
    sched.run_until_idle()
    results = collect_outputs(outputs)
    return [
        (results[f"r{i}"].output_ids, results[f"r{i}"].output_logprobs) for i in range(len(inputs))
    ]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_vlm_tp2_logprobs_match_hf(tiny):
    from mini_sglang.benchmark.tp_group import run_tp_group
    from mini_sglang.server_args import ServerArgs

    path, hf, processor = tiny
    args = ServerArgs(
        model_path=path, device="cuda", dtype="bfloat16", tp_size=2, chunked_prefill_size=24,
        max_total_tokens=4096, max_running_requests=8, mem_fraction_static=0.5, random_seed=0,
    )  # fmt: skip
    inputs = [_inputs(processor, c) for c in CASES]
    results = run_tp_group(_rank_generate, args, inputs)
    for i, ((ids, mm), (out_ids, logprobs)) in enumerate(zip(inputs, results)):
        assert len(out_ids) == MAX_NEW
        ref = _hf_token_logprobs(hf, ids, mm, out_ids)
        diff = (torch.tensor(logprobs) - ref).abs().max().item()
        assert diff < TOL, f"request {i}: {diff}"

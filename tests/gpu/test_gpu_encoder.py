"""GPU: encoder models (non-causal attention) on every attention backend, bf16, against
transformers in bf16 on the same weights.

Tiny random BertModel, BertForSequenceClassification, XLMRobertaModel and
XLMRobertaForSequenceClassification (head_dim 64, which every backend's prefill kernel
takes) run one EXTEND batch of three sequences of different lengths through the ModelRunner
of an in-process scheduler with --attention-backend torch_native / triton / flashinfer, at
page size 1 and 16 (each request's KV slots from a page boundary). The
normalized embeddings must be within 2e-2 of transformers' (per component), the scores within
5e-2 or twice transformers' own bf16 error (bf16 against float32; the tiny classifiers'
scores reach a few units, where bf16's rounding alone is ~0.1); and each backend must agree
with torch_native to the same tolerances.

Skipped without CUDA; run on the GPU machine by scripts/run_gpu_suite.sh.
"""

from __future__ import annotations

import copy
import gc

import pytest
import torch

from tests.tiny_encoders import build_tiny_encoder, extend_batch, hf_reference, tokenized_inputs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

ARCHS = [
    "BertModel",
    "BertForSequenceClassification",
    "XLMRobertaModel",
    "XLMRobertaForSequenceClassification",
]
BACKENDS = ["torch_native", "triton", "flashinfer"]
SIZES = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4)  # head_dim 64


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """arch -> (model dir, transformers model in float32 on CUDA)."""
    out = {}
    for i, arch in enumerate(ARCHS):
        path = tmp_path_factory.mktemp(arch)
        hf = build_tiny_encoder(arch, path, seed=i, **SIZES)
        out[arch] = (str(path), hf.to("cuda"))
    return out


def _available(backend: str) -> bool:
    try:
        __import__("flashinfer" if backend == "flashinfer" else "triton")
    except ImportError:
        return False
    return True


def _encode(path: str, backend: str, arch: str, page_size: int) -> torch.Tensor:
    from mini_sglang.managers.scheduler import Scheduler
    from mini_sglang.server_args import ServerArgs

    args = ServerArgs(
        model_path=path,
        device="cuda",
        dtype="bfloat16",
        attention_backend=backend,
        page_size=page_size,
        max_total_tokens=4096,
        max_running_requests=8,
        disable_cuda_graph=True,
    )
    scheduler = Scheduler(args, send_to_detokenizer=lambda _msg: None)
    runner = scheduler.tp_worker.model_runner
    seqs, types = tokenized_inputs(arch)
    batch = extend_batch(
        runner.req_to_token_pool.req_to_token,
        seqs,
        types if arch.startswith("Bert") else None,
        page_size,
    )
    out = runner.forward(runner.make_forward_batch(batch), get_embedding=True)
    result = out.embeddings.float().cpu()
    del scheduler, runner
    gc.collect()
    torch.cuda.empty_cache()
    return result


@pytest.mark.parametrize("arch", ARCHS)
def test_encoder_backends_match_transformers_bf16(saved, arch):
    path, hf32 = saved[arch]
    seqs, types = tokenized_inputs(arch)
    refs32 = torch.stack([hf_reference(hf32, arch, s, t).cpu() for s, t in zip(seqs, types)])
    hf = copy.deepcopy(hf32).to(torch.bfloat16)
    refs = torch.stack([hf_reference(hf, arch, s, t).float().cpu() for s, t in zip(seqs, types)])
    del hf
    if arch.endswith("ForSequenceClassification"):
        tol = max(5e-2, 2 * (refs - refs32).abs().max().item())
    else:
        tol = 2e-2
    outputs = {}
    for backend in BACKENDS:
        if not _available(backend):
            continue
        for page_size in (1, 16):
            outputs[backend, page_size] = got = _encode(path, backend, arch, page_size)
            what = f"{backend} page {page_size}"
            torch.testing.assert_close(got, refs, atol=tol, rtol=0, msg=f"{what} vs HF")
            native = outputs["torch_native", 1]
            torch.testing.assert_close(got, native, atol=tol, rtol=0, msg=f"{what} vs native")

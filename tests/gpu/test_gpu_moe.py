"""GPU checks of the MoE models and the fused MoE kernel.

- Tiny Qwen3-MoE, Qwen2-MoE and Mixtral models in bf16 against transformers in bf16 on every
  attention backend, CUDA graphs on: top-5 logprobs within 5e-2 at the prompt positions and
  over 32 decode steps (tests/gpu/test_gpu_correctness.py's check).
- The fused Triton path (router, block alignment, grouped GEMMs) against the torch reference
  on random shapes in bf16, including Qwen3-30B-A3B's expert shapes, batch sizes 1..512 and
  EP-dropped pairs, and replayed from a CUDA graph with new inputs.

Skipped without CUDA; run on the GPU machine by scripts/run_gpu_suite.sh (step `moe`).
"""

from __future__ import annotations

import gc

import pytest
import torch

from tests.gpu.test_gpu_correctness import (
    BACKENDS,
    HfReference,
    _backend_kwargs,
    _check_top5_against_hf,
    _make_gpu_scheduler,
)
from tests.models.test_moe_models import tiny_moe_config

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module", params=["qwen3_moe", "qwen2_moe", "mixtral"])
def tiny_moe(request, tmp_path_factory, qwen_tokenizer):
    """(model dir, HfReference in bf16) for a tiny MoE model bf16 can represent (hidden 256,
    head_dim 64, initializer_range 0.02; see test_gpu_correctness._build_gpu_tiny_model)."""
    from transformers import AutoModelForCausalLM

    cfg = tiny_moe_config(request.param, len(qwen_tokenizer))
    cfg.hidden_size, cfg.head_dim, cfg.initializer_range = 256, 64, 0.02
    if request.param == "mixtral":
        cfg.intermediate_size = 128
    else:
        cfg.intermediate_size, cfg.moe_intermediate_size = 512, 128
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).float().eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
            elif "norm" in name:
                p.copy_(1.0 + torch.randn(p.shape, generator=gen) * 0.05)
    out = tmp_path_factory.mktemp(f"gpu_{request.param}")
    model.save_pretrained(str(out), safe_serialization=True)
    qwen_tokenizer.save_pretrained(str(out))
    yield str(out), HfReference(model.to(device="cuda", dtype=torch.bfloat16))
    del model
    gc.collect()
    torch.cuda.empty_cache()


@pytest.mark.parametrize("backend", BACKENDS)
def test_moe_top5_logprobs_match_hf(tiny_moe, backend):
    model_path, hf = tiny_moe
    sched, outputs = _make_gpu_scheduler(model_path, **_backend_kwargs(backend))
    assert sched.tp_worker.model_runner.graph_runner is not None, "CUDA graphs are off"
    _check_top5_against_hf(sched, outputs, hf, late=1)


def _problem(tokens: int, E: int, k: int, H: int, inter: int, dtype, seed: int = 0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, H, device="cuda", generator=gen).to(dtype)
    w13 = (torch.randn(E, 2 * inter, H, device="cuda", generator=gen) * H**-0.5).to(dtype)
    w2 = (torch.randn(E, H, inter, device="cuda", generator=gen) * inter**-0.5).to(dtype)
    logits = torch.randn(tokens, E, device="cuda", generator=gen)
    return x, w13, w2, logits


@pytest.mark.parametrize(
    "tokens,E,k,H,inter",
    [
        (1, 128, 8, 2048, 768),  # Qwen3-30B-A3B decode, batch 1
        (37, 128, 8, 2048, 768),
        (512, 128, 8, 2048, 768),
        (3, 8, 2, 512, 256),  # Mixtral-like top-2, most experts empty
        (200, 60, 4, 256, 96),  # Qwen1.5-MoE-like expert count
    ],
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_experts_match_reference(tokens, E, k, H, inter, dtype):
    from mini_sglang.layers.moe.experts_torch import fused_experts_torch
    from mini_sglang.layers.moe.fused_moe_triton import fused_experts_triton
    from mini_sglang.layers.moe.router import select_experts, select_experts_torch

    x, w13, w2, logits = _problem(tokens, E, k, H, inter, dtype)
    w, ids = select_experts(logits, k, True)
    ref_w, ref_ids = select_experts_torch(logits, k, True)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(w, ref_w)
    ref = fused_experts_torch(x.float(), w13.float(), w2.float(), w, ids)
    out = fused_experts_triton(x, w13, w2, w, ids).float()
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    dropped = torch.where(ids >= E // 2, -1, ids)  # EP: the upper half is another rank's
    ref = fused_experts_torch(x.float(), w13.float(), w2.float(), w, dropped)
    out = fused_experts_triton(x, w13, w2, w, dropped, dropped_pairs=True).float()
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("tokens", [1, 8, 64])
def test_fused_moe_layer_replays_from_a_cuda_graph(tokens):
    """The whole layer (router, alignment, GEMMs) captured once, replayed on new inputs."""
    from mini_sglang.layers.moe.experts_torch import fused_experts_torch
    from mini_sglang.layers.moe.layer import FusedMoE
    from mini_sglang.layers.moe.router import select_experts_torch

    E, k, H, inter = 128, 8, 2048, 768
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            layer = FusedMoE(E, k, H, inter, renormalize=True)
    finally:
        torch.set_default_dtype(torch.float32)
    x, w13, w2, logits = _problem(tokens, E, k, H, inter, torch.bfloat16, seed=1)
    layer.w13_weight.data.copy_(w13)
    layer.w2_weight.data.copy_(w2)
    static_x, static_logits = x.clone(), logits.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        layer(static_x, static_logits)  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = layer(static_x, static_logits)
    for seed in (2, 3):
        x, _, _, logits = _problem(tokens, E, k, H, inter, torch.bfloat16, seed=seed)
        static_x.copy_(x)
        static_logits.copy_(logits)
        graph.replay()
        w, ids = select_experts_torch(logits, k, True)
        ref = fused_experts_torch(x.float(), w13.float(), w2.float(), w, ids)
        torch.testing.assert_close(static_out.float(), ref, atol=2e-2, rtol=2e-2)

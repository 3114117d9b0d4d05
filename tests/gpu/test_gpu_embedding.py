"""GPU embedding path: --is-embedding and score models in bf16 on each attention backend
against transformers (float32, same weights), through the real in-process Scheduler.

The tiny models of tests/models/test_embedding_models.py (Qwen3 / Llama CausalLM as
embedders, MistralModel, sentence-transformers mean pooling, the score heads), in their GPU
shape (head_dim 64, HF's initializer range: what flashinfer and bf16 need), embed a batch
of inputs of different lengths, with and without chunked prefill and with a shared prefix
in the radix cache; each row must point the same way as transformers' (cosine >= 0.999)
and lie within 5e-2 of it elementwise (bf16). Skipped without CUDA; run on the GPU
machine by scripts/run_gpu_suite.sh.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest
import torch

from tests.conftest import assert_memory_all_free, make_scheduler
from tests.models.test_embedding_models import KINDS, _build, _inputs, run_embeddings

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

TOL = 5e-2
BACKENDS = os.environ.get("MINI_SGLANG_GPU_TEST_BACKENDS", "flashinfer,triton").split(",")


@pytest.fixture(autouse=True)
def _release_gpu_memory():
    yield
    gc.collect()
    torch.cuda.empty_cache()


@pytest.mark.parametrize("backend", [b for b in BACKENDS if "+" not in b])
@pytest.mark.parametrize("kind", KINDS)
@torch.no_grad()
def test_gpu_embeddings_match_transformers(kind: str, backend: str, tmp_path: Path) -> None:
    server_kw, reference = _build(kind, tmp_path, gpu=True)
    prompts = _inputs()
    expected = [
        reference(lambda m, ids=ids: m(torch.tensor([ids])).last_hidden_state[0]).float()
        for ids in prompts
    ]
    for chunk in (None, 8):
        sched = make_scheduler(
            str(tmp_path),
            device="cuda",
            dtype="bfloat16",
            attention_backend=backend,
            skip_tokenizer_init=True,
            chunked_prefill_size=chunk,
            **server_kw,
        )
        got = {
            rid: torch.tensor(emb)
            for msg in run_embeddings(sched, prompts)
            for rid, emb in zip(msg.rids, msg.embeddings)
        }
        for i, ref in enumerate(expected):
            row = got[f"r{i}"]
            cos = torch.nn.functional.cosine_similarity(row, ref, dim=0).item()
            assert cos >= 0.999 or ref.numel() == 1, (kind, backend, chunk, i, cos)
            torch.testing.assert_close(row, ref, atol=TOL, rtol=TOL)
        assert_memory_all_free(sched)
        del sched


@torch.no_grad()
def test_gpu_engine_encode(tmp_path: Path) -> None:
    """Engine.encode (one input and a batch of token ids) on an --is-embedding Qwen3."""
    from mini_sglang.entrypoints.engine import Engine

    _, reference = _build("qwen3_causal", tmp_path, gpu=True)
    prompts = _inputs()[:3]
    expected = [
        reference(lambda m, ids=ids: m(torch.tensor([ids])).last_hidden_state[0]).float()
        for ids in prompts
    ]
    with Engine(
        model_path=str(tmp_path),
        is_embedding=True,
        skip_tokenizer_init=True,
        dtype="bfloat16",
        max_total_tokens=4096,
    ) as engine:
        one = engine.encode(input_ids=prompts[0])
        batch = engine.encode(input_ids=prompts)
    assert one["meta_info"]["prompt_tokens"] == len(prompts[0])
    torch.testing.assert_close(torch.tensor(one["embedding"]), expected[0], atol=TOL, rtol=TOL)
    assert [o["meta_info"]["prompt_tokens"] for o in batch] == [len(p) for p in prompts]
    for out, ref in zip(batch, expected):
        torch.testing.assert_close(torch.tensor(out["embedding"]), ref, atol=TOL, rtol=TOL)

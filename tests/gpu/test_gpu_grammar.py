"""Structured outputs on the GPU: the packed-bitmask application on CUDA logits (float32
and bf16) equals xgrammar's own kernel, and through a CUDA scheduler (flashinfer or triton,
CUDA graphs, overlap on) regex / json_schema / ebnf constraints hold next to plain requests.
(That plain requests keep their greedy tokens is checked on CPU in float32: in bf16 a
different batch composition may pick other kernels and flip near-ties.)

Skipped without CUDA or xgrammar.
"""

from __future__ import annotations

import json

import pytest
import torch

from mini_sglang.constrained.bitmask import allocate_token_bitmask, apply_token_bitmask
from tests.conftest import (
    GRAMMAR_EBNF,
    GRAMMAR_REGEX,
    PERSON_SCHEMA,
    make_req,
)
from tests.gpu.test_gpu_correctness import (
    _backend_kwargs,
    _build_gpu_tiny_model,
    _make_gpu_scheduler,
)
from tests.models.test_structured_output import _assert_constraints_hold, _req, _run

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]
xgrammar = pytest.importorskip("xgrammar")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bitmask_on_cuda_matches_xgrammar(dtype):
    gen = torch.Generator().manual_seed(0)
    vocab = 1000
    mask = allocate_token_bitmask(4, vocab)
    mask[1:] = torch.randint(
        -(2**31), 2**31 - 1, (3, mask.shape[1]), generator=gen, dtype=torch.int32
    )
    logits = torch.randn(4, vocab, generator=gen).to(device="cuda", dtype=dtype)
    want = logits.clone()
    xgrammar.apply_token_bitmask_inplace(want, mask.cuda())
    got = apply_token_bitmask(logits, mask.cuda())
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    assert torch.equal(got[~torch.isinf(got)], want[~torch.isinf(want)])
    assert torch.equal(got[0], logits[0])  # an all-ones row is untouched


@pytest.fixture(scope="module")
def gpu_llama_path(tmp_path_factory, qwen_tokenizer) -> str:
    """A tiny Llama with head_dim 64 (flashinfer's minimum)."""
    out = tmp_path_factory.mktemp("grammar_llama")
    _build_gpu_tiny_model("llama", out, qwen_tokenizer)
    return str(out)


@pytest.mark.parametrize("backend", ["flashinfer", "triton"])
def test_constraints_hold_on_cuda(gpu_llama_path, backend):
    sched, outputs = _make_gpu_scheduler(
        gpu_llama_path, constrained_json_disable_any_whitespace=True, **_backend_kwargs(backend)
    )
    sched.test_outputs = outputs  # what the CPU tests' helpers read
    prompts = [list(range(300, 300 + n)) for n in (4, 11, 23)]
    reqs = []
    for i, p in enumerate(prompts):
        reqs += [
            _req(f"re{i}", p, regex=GRAMMAR_REGEX),
            _req(f"js{i}", p, json_schema=json.dumps(PERSON_SCHEMA)),
            _req(f"eb{i}", p, ebnf=GRAMMAR_EBNF),
            make_req(f"p{i}", p, 12, ignore_eos=True),
        ]
    out = _run(sched, reqs)
    tok = sched.tokenizer
    for i in range(len(prompts)):
        _assert_constraints_hold(tok, out, i, "xgrammar")
        assert len(out[f"p{i}"].output_ids) == 12
    assert sched.stats.check_memory()

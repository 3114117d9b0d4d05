"""The CUDA sampler paths draw from the right distribution: plain temperature sampling
(flashinfer's one-pass sampling from logits), top-k/top-p (flashinfer's rejection sampler)
and rows mixing greedy with sampled, each against the exact softmax over 40,000 draws.

Skipped without CUDA.
"""

from __future__ import annotations

import pytest
import torch

from mini_sglang.layers.sampler import Sampler
from mini_sglang.managers.req import Req
from mini_sglang.sampling.sampling_batch_info import SamplingBatchInfo
from mini_sglang.sampling.sampling_params import SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

VOCAB = 12
ROWS = 40_000


def _info(params: list[dict]) -> SamplingBatchInfo:
    reqs = []
    for i, p in enumerate(params):
        sp = SamplingParams(max_new_tokens=4, **p)
        sp.normalize(None)
        reqs.append(Req(f"r{i}", "", [1, 2, 3], sp, vocab_size=VOCAB))
    return SamplingBatchInfo.from_reqs(reqs, VOCAB, "cuda")


@pytest.mark.parametrize(
    "params",
    [
        {"temperature": 0.7},
        {"temperature": 1.3, "top_k": 5, "top_p": 0.9},
    ],
)
@pytest.mark.parametrize("backend", ["flashinfer", "pytorch"])  # --sampling-backend
def test_sampled_frequencies_match_softmax(params, backend):
    gen = torch.Generator().manual_seed(0)
    row = torch.randn(VOCAB, generator=gen) * 2
    info = _info([params] * ROWS)
    logits = row.expand(ROWS, VOCAB).contiguous().cuda()
    ids = Sampler(backend)(
        logits, info, torch.zeros(ROWS, dtype=torch.int64, device="cuda")
    ).next_token_ids
    freq = torch.bincount(ids.cpu(), minlength=VOCAB).double() / ROWS
    probs = torch.softmax(row.double() / params["temperature"], -1)
    if "top_k" in params:
        keep = torch.zeros(VOCAB, dtype=torch.bool)
        order = probs.argsort(descending=True)
        cum = probs[order].cumsum(0)
        top = order[: params["top_k"]]
        top = top[(cum[: params["top_k"]] - probs[top]) < params["top_p"]]
        keep[top] = True
        probs = torch.where(keep, probs, 0.0)
        probs /= probs.sum()
    assert (freq - probs).abs().max() < 0.015, (freq, probs)


def test_greedy_rows_among_sampled_rows_take_argmax():
    info = _info([{"temperature": 0}, {"temperature": 1.0}] * 500)
    logits = torch.randn(1000, VOCAB, device="cuda")
    ids = Sampler()(
        logits, info, torch.zeros(1000, dtype=torch.int64, device="cuda")
    ).next_token_ids
    assert torch.equal(ids[0::2], logits[0::2].argmax(-1))
    assert not torch.equal(ids[1::2], logits[1::2].argmax(-1))


@pytest.mark.parametrize("b,v", [(1, 128256), (3, 151936), (8, 49152), (2, 32001)])
def test_greedy_argmax_matches_argmax_on_cuda(b, v):
    from mini_sglang.layers.sampler import greedy_argmax

    torch.manual_seed(0)
    logits = torch.randn(b, v, device="cuda").round(decimals=1)  # ties in most rows
    assert torch.equal(greedy_argmax(logits), logits.argmax(dim=-1))

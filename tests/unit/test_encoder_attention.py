"""Encoder-only (non-causal) extend attention in the torch_native and triton backends.

A batch of fresh sequences of different lengths, with K/V slots scattered over the pool
(page_size 1, or whole pages of 16), goes through each backend's ForwardBatch path with an
ENCODER_ONLY RadixAttention layer; every request's output must equal torch's
scaled_dot_product_attention with is_causal=False over that request alone (float32). The same
layer as DECODER must still differ (the causal mask is really lifted, not ignored).

Without CUDA the Triton kernel runs in Triton's interpreter (TRITON_INTERPRET=1 is set before
triton is imported).
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

CUDA = torch.cuda.is_available()
if not CUDA:
    # Must precede the first import of triton / of our kernels (read at @triton.jit time).
    os.environ["TRITON_INTERPRET"] = "1"

from mini_sglang.layers.attention.torch_native_backend import (  # noqa: E402
    TorchNativeAttnBackend,
)
from mini_sglang.layers.radix_attention import AttentionType, RadixAttention  # noqa: E402
from mini_sglang.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool  # noqa: E402
from mini_sglang.model_executor.forward_batch_info import ForwardBatch, ForwardMode  # noqa: E402

DEVICE = torch.device("cuda" if CUDA else "cpu")
KV_HEADS, GROUP, HEAD_DIM = 2, 2, 32
LENS = [5, 70, 1, 17]  # 70: two query blocks of the Triton kernel


def _backend(name: str, runner):
    if name == "torch_native":
        return TorchNativeAttnBackend(runner)
    pytest.importorskip("triton")
    from mini_sglang.layers.attention.triton_backend import TritonAttnBackend
    from tests.conftest import fix_triton_interpreter_index

    if not CUDA:
        fix_triton_interpreter_index()
    return TritonAttnBackend(runner, num_kv_splits=2)


def _slots(page_size: int, gen: torch.Generator) -> list[torch.Tensor]:
    """Each request's KV slots in token order: a random permutation (page_size 1) or random
    whole pages; slot 0 is never used."""
    if page_size == 1:
        return list(torch.split(torch.randperm(sum(LENS), generator=gen) + 1, LENS))
    n_pages = [(n + page_size - 1) // page_size for n in LENS]
    pages = torch.split(torch.randperm(sum(n_pages), generator=gen) + 1, n_pages)
    offs = torch.arange(page_size)
    return [(p[:, None] * page_size + offs).flatten()[:n] for p, n in zip(pages, LENS)]


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("backend_name", ["torch_native", "triton"])
def test_encoder_extend_matches_sdpa_non_causal(backend_name, page_size):
    heads = KV_HEADS * GROUP
    cfg = SimpleNamespace(
        num_attention_heads=heads, num_kv_heads_per_rank=lambda tp: KV_HEADS, head_dim=HEAD_DIM
    )
    r2t_pool = ReqToTokenPool(6, 128, DEVICE)
    kv_pool = MHATokenToKVPool(400, torch.float32, KV_HEADS, HEAD_DIM, 1, DEVICE)
    runner = SimpleNamespace(
        model_config=cfg, device=DEVICE, req_to_token_pool=r2t_pool, page_size=page_size
    )
    backend = _backend(backend_name, runner)
    gen = torch.Generator().manual_seed(7)
    rows = [3, 0, 5, 1]
    slots = _slots(page_size, gen)
    for row, s in zip(rows, slots):
        r2t_pool.req_to_token[row, : len(s)] = s.to(DEVICE, torch.int32)
    n = sum(LENS)
    q = torch.randn(n, heads * HEAD_DIM, generator=gen).to(DEVICE)
    k = torch.randn(n, KV_HEADS, HEAD_DIM, generator=gen).to(DEVICE)
    v = torch.randn(n, KV_HEADS, HEAD_DIM, generator=gen).to(DEVICE)
    ext = torch.tensor(LENS, dtype=torch.int32)
    fb = ForwardBatch(
        forward_mode=ForwardMode.EXTEND,
        batch_size=len(LENS),
        input_ids=torch.zeros(n, dtype=torch.int64, device=DEVICE),
        positions=torch.cat([torch.arange(x) for x in LENS]).to(DEVICE),
        req_pool_indices=torch.tensor(rows, device=DEVICE),
        seq_lens=ext.to(DEVICE, torch.int64),
        seq_lens_cpu=ext.to(torch.int64),
        out_cache_loc=torch.cat(slots).to(DEVICE),
        req_to_token_pool=r2t_pool,
        token_to_kv_pool=kv_pool,
        attn_backend=backend,
    )
    fb.extend_seq_lens_cpu = list(LENS)
    fb.extend_prefix_lens_cpu = [0] * len(LENS)
    fb.extend_seq_lens = ext.to(DEVICE)
    fb.extend_prefix_lens = torch.zeros(len(LENS), dtype=torch.int32, device=DEVICE)
    fb.extend_start_loc = (torch.cumsum(ext, 0, dtype=torch.int32) - ext).to(DEVICE)
    backend.init_forward_metadata(fb)

    def layer(attn_type: AttentionType) -> RadixAttention:
        return RadixAttention(heads, HEAD_DIM, HEAD_DIM**-0.5, KV_HEADS, 0, attn_type=attn_type)

    out = backend.forward(q, k, v, layer(AttentionType.ENCODER_ONLY), fb)
    causal = backend.forward(q, k, v, layer(AttentionType.DECODER), fb)
    assert out.shape == (n, heads * HEAD_DIM)
    start = 0
    for length in LENS:
        sl = slice(start, start + length)
        qi = q[sl].view(length, heads, HEAD_DIM).transpose(0, 1)[None]
        ki = k[sl].transpose(0, 1).repeat_interleave(GROUP, dim=0)[None]
        vi = v[sl].transpose(0, 1).repeat_interleave(GROUP, dim=0)[None]
        ref = F.scaled_dot_product_attention(qi, ki, vi, is_causal=False)[0].transpose(0, 1)
        torch.testing.assert_close(out[sl], ref.reshape(length, -1), atol=1e-4, rtol=1e-4)
        if length > 1:
            assert not torch.allclose(causal[sl], out[sl], atol=1e-3)
        start += length

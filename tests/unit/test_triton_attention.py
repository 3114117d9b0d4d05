"""The triton attention backend against an independent torch reference.

Kernels (decode split-KV + reduce, extend with a cached prefix) are checked in float32
against plain softmax attention over K/V gathered from a pool whose slots are scattered
(random permutation, page_size 1, or random whole pages of 16), with GQA ratios 1/2/4/20 and
head_dim 32/64/80/96/128. The backend is checked through ForwardBatch against torch_native,
and end to end: a tiny Qwen3 model generates the same tokens and logprobs with either.

Without CUDA everything runs on CPU tensors in Triton's interpreter (TRITON_INTERPRET=1 is
set before triton is imported); with CUDA the same tests run compiled on the GPU, plus
bfloat16 and CUDA-graph replay checks.
"""

from __future__ import annotations

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    # Must precede the first import of triton / of our kernels (read at @triton.jit time).
    os.environ["TRITON_INTERPRET"] = "1"

triton = pytest.importorskip("triton")

from mini_sglang.layers.attention.triton_ops import (  # noqa: E402
    decode_attention_fwd,
    extend_attention_fwd,
)
from tests.conftest import fix_triton_interpreter_index  # noqa: E402

DEVICE = torch.device("cuda" if CUDA else "cpu")
DTYPES = [torch.float32, torch.bfloat16] if CUDA else [torch.float32]
KV_HEADS = 2


if not CUDA:
    fix_triton_interpreter_index()


# ---- pool layout and reference --------------------------------------------------------
def _scatter_slots(lens: list[int], page_size: int, gen: torch.Generator) -> list[torch.Tensor]:
    """Each request's KV slots in token order, scattered over a pool whose slot 0 stays
    unused. page_size 1: a random permutation of slots. page_size P: random whole pages
    (page p = slots p*P .. p*P+P-1, page 0 never used), each filled in order. Example, P 4,
    len 6, pages [7, 2]: slots [28 29 30 31 8 9]."""
    if page_size == 1:
        perm = torch.randperm(sum(lens), generator=gen) + 1
        return list(torch.split(perm, lens))
    n_pages = [(n + page_size - 1) // page_size for n in lens]
    pages = torch.split(torch.randperm(sum(n_pages), generator=gen) + 1, n_pages)
    offs = torch.arange(page_size)
    return [(p[:, None] * page_size + offs).flatten()[:n] for p, n in zip(pages, lens)]


def _make_pool(lens: list[int], page_size: int, head_dim: int, dtype: torch.dtype, seed: int):
    """(k_buf, v_buf, req_to_token, req_pool_indices, slots): random K/V in a pool with the
    requests' slots scattered, their rows of req_to_token picked at random."""
    gen = torch.Generator().manual_seed(seed)
    slots = _scatter_slots(lens, page_size, gen)
    num_slots = int(max(int(s.max()) for s in slots)) + 1 + page_size
    k_buf = torch.randn(num_slots, KV_HEADS, head_dim, generator=gen).to(DEVICE, dtype)
    v_buf = torch.randn(num_slots, KV_HEADS, head_dim, generator=gen).to(DEVICE, dtype)
    rows = torch.randperm(len(lens) + 3, generator=gen)[: len(lens)]
    req_to_token = torch.zeros(len(lens) + 3, max(lens) + 8, dtype=torch.int32)
    for row, s in zip(rows.tolist(), slots):
        req_to_token[row, : len(s)] = s.to(torch.int32)
    return k_buf, v_buf, req_to_token.to(DEVICE), rows.to(DEVICE), slots


def _reference(q, k_buf, v_buf, slots, q_pos, scale) -> torch.Tensor:
    """Softmax attention in float64 for queries q [n, H, D] at absolute positions q_pos [n]
    over keys at slots [L] (key j sits at position j and is visible iff j <= q_pos)."""
    group = q.shape[1] // k_buf.shape[1]
    k = k_buf[slots.long()].double().cpu().repeat_interleave(group, dim=1)  # [L, H, D]
    v = v_buf[slots.long()].double().cpu().repeat_interleave(group, dim=1)
    s = torch.einsum("nhd,lhd->hnl", q.double().cpu(), k) * scale
    visible = torch.arange(len(slots))[None, :] <= q_pos[:, None]
    s = s.masked_fill(~visible, float("-inf"))
    return torch.einsum("hnl,lhd->nhd", s.softmax(-1), v)


def _tol(dtype: torch.dtype) -> dict:
    return {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 0}


# ---- kernels ---------------------------------------------------------------------------
# group 20: two blocks of 16 q heads per kv head, the second one partly masked.
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "group,head_dim,num_splits,page_size",
    [(1, 64, 8, 1), (4, 128, 3, 16), (4, 64, 1, 1), (2, 80, 8, 16), (20, 32, 2, 1)],
)
def test_decode_kernel_matches_reference(group, head_dim, num_splits, page_size, dtype):
    lens = [1, 7, 130, 513]
    k_buf, v_buf, r2t, rows, slots = _make_pool(lens, page_size, head_dim, dtype, seed=group)
    heads = KV_HEADS * group
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(len(lens), heads, head_dim, generator=gen).to(DEVICE, dtype)
    o = torch.full_like(q, float("nan"))
    mid_o = torch.empty(len(lens), heads, num_splits, head_dim, device=DEVICE)
    mid_lse = torch.empty(len(lens), heads, num_splits, device=DEVICE)
    seq_lens = torch.tensor(lens, device=DEVICE)
    scale = head_dim**-0.5
    decode_attention_fwd(q, k_buf, v_buf, o, r2t, rows, seq_lens, mid_o, mid_lse, scale)
    for b, n in enumerate(lens):
        ref = _reference(q[b : b + 1], k_buf, v_buf, slots[b], torch.tensor([n - 1]), scale)
        torch.testing.assert_close(o[b : b + 1].double().cpu(), ref, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group,head_dim,page_size", [(1, 64, 1), (4, 128, 16), (2, 96, 1)])
def test_extend_kernel_matches_reference(group, head_dim, page_size, dtype):
    # Fresh prompts, prompts on a cached prefix, a 70-token extend (two query blocks of 64),
    # a one-token extend and a request with no new tokens (skipped, rows untouched).
    prefix = [0, 9, 0, 40, 17]
    ext = [5, 3, 70, 1, 0]
    lens = [p + e for p, e in zip(prefix, ext)]
    k_buf, v_buf, r2t, rows, slots = _make_pool(lens, page_size, head_dim, dtype, seed=group)
    heads = KV_HEADS * group
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(sum(ext), heads, head_dim, generator=gen).to(DEVICE, dtype)
    o = torch.full_like(q, float("nan"))
    ext_t = torch.tensor(ext, dtype=torch.int32)
    start = torch.cumsum(ext_t, 0, dtype=torch.int32) - ext_t
    scale = head_dim**-0.5
    extend_attention_fwd(
        q,
        o,
        k_buf,
        v_buf,
        r2t,
        rows,
        torch.tensor(lens, device=DEVICE),
        ext_t.to(DEVICE),
        start.to(DEVICE),
        max(ext),
        scale,
    )
    for b in range(len(lens)):
        s, e = int(start[b]), ext[b]
        q_pos = prefix[b] + torch.arange(e)
        ref = _reference(q[s : s + e], k_buf, v_buf, slots[b], q_pos, scale)
        torch.testing.assert_close(o[s : s + e].double().cpu(), ref, **_tol(dtype))


# ---- the backend through ForwardBatch, against torch_native ---------------------------
def _backend_setup(page_size: int, head_dim: int = 32, group: int = 2):
    from types import SimpleNamespace

    from mini_sglang.layers.radix_attention import RadixAttention
    from mini_sglang.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

    heads = KV_HEADS * group
    cfg = SimpleNamespace(
        num_attention_heads=heads,
        num_kv_heads_per_rank=lambda tp: KV_HEADS,
        head_dim=head_dim,
    )
    r2t_pool = ReqToTokenPool(6, 128, DEVICE)
    kv_pool = MHATokenToKVPool(400, torch.float32, KV_HEADS, head_dim, 1, DEVICE)
    runner = SimpleNamespace(
        model_config=cfg, device=DEVICE, req_to_token_pool=r2t_pool, page_size=page_size
    )
    layer = RadixAttention(heads, head_dim, head_dim**-0.5, KV_HEADS, layer_id=0)
    return runner, r2t_pool, kv_pool, layer


def _forward_batch(mode, rows, seq_lens, out_loc, r2t_pool, kv_pool, backend, ext=None):
    from mini_sglang.model_executor.forward_batch_info import ForwardBatch

    n = len(out_loc)
    fb = ForwardBatch(
        forward_mode=mode,
        batch_size=len(rows),
        input_ids=torch.zeros(n, dtype=torch.int64, device=DEVICE),
        positions=torch.zeros(n, dtype=torch.int64, device=DEVICE),
        req_pool_indices=torch.tensor(rows, device=DEVICE),
        seq_lens=torch.tensor(seq_lens, device=DEVICE),
        seq_lens_cpu=torch.tensor(seq_lens),
        out_cache_loc=out_loc.to(DEVICE),
        req_to_token_pool=r2t_pool,
        token_to_kv_pool=kv_pool,
        attn_backend=backend,
    )
    if ext is not None:
        ext_t = torch.tensor(ext, dtype=torch.int32)
        fb.extend_seq_lens_cpu = ext
        fb.extend_prefix_lens_cpu = [s - e for s, e in zip(seq_lens, ext)]
        fb.extend_seq_lens = ext_t.to(DEVICE)
        fb.extend_prefix_lens = torch.tensor(fb.extend_prefix_lens_cpu, device=DEVICE)
        fb.extend_start_loc = (torch.cumsum(ext_t, 0, dtype=torch.int32) - ext_t).to(DEVICE)
    return fb


@pytest.mark.parametrize("page_size", [1, 16])
def test_backend_extend_then_decode_matches_torch_native(page_size):
    """Prefill on a cached prefix, then one decode step: the triton backend writes the new
    K/V at out_cache_loc and returns what torch_native returns."""
    from mini_sglang.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from mini_sglang.layers.attention.triton_backend import TritonAttnBackend
    from mini_sglang.model_executor.forward_batch_info import ForwardMode

    runner, r2t_pool, kv_pool, layer = _backend_setup(page_size)
    triton_be, native_be = (
        TritonAttnBackend(runner, num_kv_splits=4),
        TorchNativeAttnBackend(runner),
    )
    gen = torch.Generator().manual_seed(3)
    prefix, ext, rows = [0, 21], [6, 4], [4, 1]
    lens = [p + e + 1 for p, e in zip(prefix, ext)]  # + the decode token
    slots = _scatter_slots(lens, page_size, gen)
    for row, s in zip(rows, slots):
        r2t_pool.req_to_token[row, : len(s)] = s.to(DEVICE, torch.int32)
    k_buf, v_buf = kv_pool.get_kv_buffer(0)
    k_buf[slots[1][:21].to(DEVICE)] = torch.randn(21, KV_HEADS, layer.head_dim).to(DEVICE)
    v_buf[slots[1][:21].to(DEVICE)] = torch.randn(21, KV_HEADS, layer.head_dim).to(DEVICE)
    h, kh, d = layer.tp_q_head_num, KV_HEADS, layer.head_dim

    steps = [  # (mode, seq_lens, new-token slots, ext)
        (ForwardMode.EXTEND, [6, 25], torch.cat([slots[0][:6], slots[1][21:25]]), ext),
        (ForwardMode.DECODE, lens, torch.stack([slots[0][6], slots[1][25]]), None),
    ]
    for mode, seq_lens, out_loc, step_ext in steps:
        n = len(out_loc)
        q = torch.randn(n, h * d, generator=gen).to(DEVICE)
        k = torch.randn(n, kh, d, generator=gen).to(DEVICE)
        v = torch.randn(n, kh, d, generator=gen).to(DEVICE)
        outs = []
        for be in (triton_be, native_be):
            fb = _forward_batch(mode, rows, seq_lens, out_loc, r2t_pool, kv_pool, be, step_ext)
            be.init_forward_metadata(fb)
            outs.append(be.forward(q, k, v, layer, fb))
            if be is triton_be:
                torch.testing.assert_close(k_buf[out_loc.to(DEVICE)], k, atol=0, rtol=0)
                torch.testing.assert_close(v_buf[out_loc.to(DEVICE)], v, atol=0, rtol=0)
        assert outs[0].shape == (n, h * d)
        torch.testing.assert_close(outs[0], outs[1], atol=1e-4, rtol=1e-4)


def test_hybrid_routes_small_decode_batches_to_their_backend():
    """HybridAttnBackend with a small-decode side (what ModelRunner builds on CUDA: flashinfer
    plus Triton for decode batches of <= N requests): a decode batch of one request is
    planned and computed by the small side, a batch of two by the decode side, and both
    give torch_native's output."""
    from mini_sglang.layers.attention.hybrid_backend import HybridAttnBackend
    from mini_sglang.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from mini_sglang.layers.attention.triton_backend import TritonAttnBackend
    from mini_sglang.model_executor.forward_batch_info import ForwardMode

    runner, r2t_pool, kv_pool, layer = _backend_setup(1)
    native = TorchNativeAttnBackend(runner)
    small = TritonAttnBackend(runner, num_kv_splits=4)
    hybrid = HybridAttnBackend(native, native, small, small_decode_max_bs=1)
    gen = torch.Generator().manual_seed(5)
    lens, rows = [9, 30], [2, 3]
    slots = _scatter_slots(lens, 1, gen)
    for row, s in zip(rows, slots):
        r2t_pool.req_to_token[row, : len(s)] = s.to(DEVICE, torch.int32)
    k_buf, v_buf = kv_pool.get_kv_buffer(0)
    h, d = layer.tp_q_head_num, layer.head_dim
    for s in slots:
        k_buf[s.to(DEVICE)] = torch.randn(len(s), KV_HEADS, d, generator=gen).to(DEVICE)
        v_buf[s.to(DEVICE)] = torch.randn(len(s), KV_HEADS, d, generator=gen).to(DEVICE)
    for n, small_side in ((1, True), (2, False)):
        small.mid = None
        q = torch.randn(n, h * d, generator=gen).to(DEVICE)
        last = torch.stack([s[-1] for s in slots[:n]])
        args = (ForwardMode.DECODE, rows[:n], lens[:n], last, r2t_pool, kv_pool)
        fb = _forward_batch(*args, hybrid)
        hybrid.init_forward_metadata(fb)
        assert (small.mid is not None) == small_side
        out = hybrid.forward(q, None, None, layer, fb, save_kv_cache=False)
        ref_fb = _forward_batch(*args, native)
        native.init_forward_metadata(ref_fb)
        ref = native.forward(q, None, None, layer, ref_fb, save_kv_cache=False)
        torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def test_hybrid_prefill_fallback_serves_extends_until_the_build_ends():
    """HybridAttnBackend with a prefill fallback (what ModelRunner builds while flashinfer's
    batch-prefill module compiles, torch_native standing in for flashinfer here): an extend
    batch planned while the build is in flight runs wholly on the Triton side, also when the
    build ends between its plan and its layers; the next extend batch runs on the prefill
    side. Both give torch_native's output."""
    import threading

    from mini_sglang.layers.attention.hybrid_backend import HybridAttnBackend
    from mini_sglang.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from mini_sglang.layers.attention.triton_backend import TritonAttnBackend
    from mini_sglang.model_executor.forward_batch_info import ForwardMode

    runner, r2t_pool, kv_pool, layer = _backend_setup(16)
    native, ref = TorchNativeAttnBackend(runner), TorchNativeAttnBackend(runner)
    triton_be = TritonAttnBackend(runner, num_kv_splits=4)
    built = threading.Event()  # the background build's end: the input of the choice
    hybrid = HybridAttnBackend(
        native, native, prefill_fallback=triton_be, prefill_ready=built.is_set
    )
    gen = torch.Generator().manual_seed(6)
    rows = [4, 1]
    slots = _scatter_slots([9, 5], 16, gen)
    for row, s in zip(rows, slots):
        r2t_pool.req_to_token[row, : len(s)] = s.to(DEVICE, torch.int32)
    h, d = layer.tp_q_head_num, layer.head_dim
    batches = [  # (rows, seq_lens, extend lens, new-token slots): fresh prompts, then
        # request 4 extends its 6 cached tokens by 3
        (rows, [6, 5], [6, 5], torch.cat([slots[0][:6], slots[1]])),
        (rows[:1], [9], [3], slots[0][6:9]),
    ]
    for i, (b_rows, seq_lens, ext, out_loc) in enumerate(batches):
        n = len(out_loc)
        q = torch.randn(n, h * d, generator=gen).to(DEVICE)
        k = torch.randn(n, KV_HEADS, d, generator=gen).to(DEVICE)
        v = torch.randn(n, KV_HEADS, d, generator=gen).to(DEVICE)
        args = (ForwardMode.EXTEND, b_rows, seq_lens, out_loc, r2t_pool, kv_pool)
        fb = _forward_batch(*args, hybrid, ext)
        hybrid.init_forward_metadata(fb)
        assert hybrid.extend_backend is (triton_be if i == 0 else native)
        built.set()  # after the first batch's plan: its layers stay on the Triton side
        out = hybrid.forward(q, k, v, layer, fb)
        ref_fb = _forward_batch(*args, ref, ext)
        ref.init_forward_metadata(ref_fb)
        want = ref.forward(q, None, None, layer, ref_fb, save_kv_cache=False)
        torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)
    assert hybrid.prefill_fallback is None  # dropped once built


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need CUDA")
def test_decode_cuda_graph_replay_matches_reference():
    """Capture decode at bs 4 with seq_len 1 everywhere, then replay with other lengths:
    the captured grid and scratch must serve any lengths the static buffers hold."""
    from mini_sglang.layers.attention.triton_backend import TritonAttnBackend
    from mini_sglang.model_executor.forward_batch_info import ForwardMode

    runner, r2t_pool, kv_pool, layer = _backend_setup(1, head_dim=64, group=4)
    be = TritonAttnBackend(runner)
    be.init_cuda_graph_state(8, 8)
    bs, h, d = 4, layer.tp_q_head_num, layer.head_dim
    fb = _forward_batch(
        ForwardMode.DECODE,
        [0] * bs,
        [1] * bs,
        torch.zeros(bs, dtype=torch.int64),
        r2t_pool,
        kv_pool,
        be,
    )
    q_static = torch.zeros(bs, h * d, device=DEVICE)
    be.init_forward_metadata_capture_cuda_graph(bs, fb)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        be.forward_decode(q_static, None, None, layer, fb, save_kv_cache=False)  # compile
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = be.forward_decode(q_static, None, None, layer, fb, save_kv_cache=False)

    k_buf, v_buf = kv_pool.get_kv_buffer(0)
    k_buf.copy_(torch.randn_like(k_buf))
    v_buf.copy_(torch.randn_like(v_buf))
    gen = torch.Generator().manual_seed(4)
    for lens in ([1, 7, 100, 127], [127, 2, 1, 64]):
        rows = [5, 2, 3, 1]
        slots = _scatter_slots(lens, 1, gen)
        for row, s in zip(rows, slots):
            r2t_pool.req_to_token[row, : len(s)] = s.to(DEVICE, torch.int32)
        q = torch.randn(bs, h, d, generator=gen).to(DEVICE)
        q_static.copy_(q.view(bs, -1))
        fb.req_pool_indices.copy_(torch.tensor(rows))
        fb.seq_lens.copy_(torch.tensor(lens))
        fb.seq_lens_cpu = torch.tensor(lens)
        be.init_forward_metadata_replay_cuda_graph(bs, fb)
        graph.replay()
        torch.cuda.synchronize()
        for b, n in enumerate(lens):
            ref = _reference(
                q[b : b + 1], k_buf, v_buf, slots[b], torch.tensor([n - 1]), layer.scaling
            )
            got = out.view(bs, h, d)[b : b + 1].double().cpu()
            torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


# ---- end to end: a tiny model through the scheduler -----------------------------------
@pytest.mark.skipif(CUDA, reason="CPU interpreter run; tests/gpu covers triton end to end")
def test_tiny_model_generates_like_torch_native(tmp_path, qwen_tokenizer):
    """Greedy tokens and their logprobs from a tiny Qwen3 model match torch_native, with
    requests joining mid-decode and a radix-cache prefix hit."""
    from mini_sglang.layers.attention.triton_backend import TritonAttnBackend
    from tests.conftest import build_tiny_model, make_scheduler, run_prompts

    build_tiny_model("qwen3", tmp_path, qwen_tokenizer)  # head_dim 32, 4 q / 2 kv heads
    gen = torch.Generator().manual_seed(5)
    long = torch.randint(100, 5000, (40,), generator=gen).tolist()
    prompts = [long, [7, 8, 9], long[:24] + [11, 12, 13, 14]]  # the last hits long's prefix
    kw = dict(max_new_tokens=5, stagger=lambda i: [0, 2, 6][i])  # long is done before the last
    # Output logprobs only: asking for prompt logprobs from 0 would disable the prefix match.
    kw.update(return_logprob=True)
    results = []
    for use_triton in (False, True):
        sched = make_scheduler(str(tmp_path), max_total_tokens=512)
        if use_triton:
            runner = sched.tp_worker.model_runner
            be = runner.attn_backend = TritonAttnBackend(runner, num_kv_splits=2)
            plan, seen = be.init_forward_metadata, []

            def spy(fb, plan=plan, seen=seen):
                seen.append((fb.forward_mode.is_decode(), fb.extend_prefix_lens_cpu))
                plan(fb)

            be.init_forward_metadata = spy
        results.append(run_prompts(sched, prompts, **kw))
    # The triton backend really ran decodes and an extend on a cached prefix.
    assert any(is_decode for is_decode, _ in seen)
    assert any(prefix and max(prefix) > 0 for _, prefix in seen), str(seen)
    for ref, got in zip(*results):
        assert got.output_ids == ref.output_ids and len(got.output_logprobs) == 5
        torch.testing.assert_close(got.output_logprobs, ref.output_logprobs, atol=1e-4, rtol=0)

"""Decode attention kernels alone, by batch size and context: time per call and KV bandwidth.

    python benchmarks/bench_decode_attention.py --q-heads 32 --kv-heads 8 --head-dim 128 \\
        --batch-sizes 1 64 128 256 --context 512 1024 2048 [--page-size 1] [--out r.jsonl]
        [--kv-dtype fp8_e4m3]

No model is loaded, so a whole grid takes seconds of device time. For each (batch, context)
it fills a bf16 KV pool whose slots are a random permutation (what a long-running server's
pool looks like), plans once, then times 50 calls with CUDA events for:
  fi_tc  flashinfer BatchDecodeWithPagedKVCacheWrapper, use_tensor_cores=True
  fi_cc  the same with CUDA cores
  fi_tc_nosplit  fi_tc planned with disable_split_kv (one program per request and head
         group: no partial results and no merge kernel); not in the default --kernels
  fi_tc_graph  fi_tc as a CUDA-graph decode step runs it: a use_cuda_graph wrapper over
         fixed index buffers (flashinfer_backend's graph wrappers), whose plan may split the
         KV where the eager plan of the same batch does not; timed as a graph replay (the
         other kernels are timed as eager launches). No graph arm plans with
         disable_split_kv: that plan was slower here at every shape tried and could fault
         (an illegal memory access) depending on what ran before it
         (docs/performance/decode-attention.md)
  triton mini-sglang's split-KV kernel (triton_ops/decode_attention.py), 8 splits
  xqa    flashinfer's XQA decode (TensorRT-LLM's; trtllm_batch_decode_with_kv_cache with
         backend "xqa"): on Hopper it runs FP8 tensor-core math over an FP8 e4m3 pool;
         pages of 16, 32, 64 or 128 only (--page-size), so not in the default --kernels
Each kernel's output is first checked against the fp32 softmax reference on the same data
(max abs error printed; nan where batch x context > 65536, too large for the reference),
so a fast-but-wrong kernel shows up. "TB/s" counts the K and V
bytes every call must read (batch x context x kv_heads x head_dim x 2 bytes x 2), the
quantity a bandwidth-bound decode kernel is limited by (H100 ~3.35, H200 ~4.8 TB/s peak).
--kv-dtype fp8_e4m3 / fp8_e5m2 stores the pool in FP8 (scale 1.0, as `--kv-cache-dtype`
without checkpoint scales; one byte per element in the TB/s count), queries stay bf16.
Per layer of Llama-3.1-8B: --q-heads 32 --kv-heads 8 --head-dim 128; Qwen3-0.6B: 16 8 128.
"""

from __future__ import annotations

import argparse
import json

import torch

from mini_sglang.utils.cuda_timing import cuda_time_ms

KERNELS = ("fi_tc", "fi_cc", "triton", "xqa", "fi_tc_nosplit", "fi_tc_graph")
DEFAULT_KERNELS = ("fi_tc", "fi_cc", "triton")


def make_pool(
    bs: int, ctx: int, kv_heads: int, head_dim: int, page: int, dev: str,
    kv_dtype: torch.dtype = torch.bfloat16,
):  # fmt: skip
    """A KV pool holding bs requests of ctx tokens in shuffled pages, plus the index views
    each kernel family wants. Slot 0 (page 0) stays unused, as in the real pool."""
    pages_per_req = (ctx + page - 1) // page
    num_pages = bs * pages_per_req
    perm = torch.randperm(num_pages, device=dev) + 1  # page ids 1..num_pages, shuffled
    req_pages = perm.view(bs, pages_per_req).to(torch.int32)
    shape = (num_pages + 1, page, kv_heads, head_dim)
    k = torch.randn(shape, dtype=torch.bfloat16, device=dev).to(kv_dtype)
    v = torch.randn(shape, dtype=torch.bfloat16, device=dev).to(kv_dtype)
    # req_to_token: token j of request r -> slot page_of(j) * page + j % page
    j = torch.arange(ctx, device=dev)
    req_to_token = (req_pages[:, j // page].long() * page + j % page).to(torch.int32)
    kv_indptr = torch.arange(bs + 1, dtype=torch.int32) * pages_per_req
    last_page_len = torch.full((bs,), (ctx - 1) % page + 1, dtype=torch.int32)
    return k, v, req_pages, req_to_token, kv_indptr, last_page_len


def reference(q, k, v, req_to_token, group: int) -> torch.Tensor:
    """fp32 softmax attention of each request's one query over its ctx keys."""
    kv_heads, head_dim = k.shape[2], k.shape[3]
    flat_k = k.view(-1, kv_heads, head_dim).float()[req_to_token.long()]  # [bs, ctx, H, D]
    flat_v = v.view(-1, kv_heads, head_dim).float()[req_to_token.long()]
    flat_k = flat_k.repeat_interleave(group, dim=2)
    flat_v = flat_v.repeat_interleave(group, dim=2)
    s = torch.einsum("bhd,bnhd->bhn", q.float(), flat_k) / head_dim**0.5
    return torch.einsum("bhn,bnhd->bhd", s.softmax(-1), flat_v)


def is_graph_arm(name: str) -> bool:
    """Whether kernel `name` is planned for, and timed as, a CUDA-graph replay."""
    return name == "fi_tc_graph"


def kernel_fn(name: str, q, k, v, pool, args, workspace):
    """A zero-argument callable that runs kernel `name` once (planned already)."""
    _, _, req_pages, req_to_token, kv_indptr, last_page_len = pool
    bs, q_heads, head_dim = q.shape
    if name.startswith("fi_"):
        import flashinfer

        indices = req_pages.reshape(-1).contiguous()
        buffers = {}
        if is_graph_arm(name):  # the buffers a captured graph reads, fixed before capture
            buffers = dict(
                use_cuda_graph=True,
                paged_kv_indptr_buffer=kv_indptr.to(q.device),
                paged_kv_indices_buffer=indices,
                paged_kv_last_page_len_buffer=last_page_len.to(q.device),
            )
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace, "NHD", use_tensor_cores=name != "fi_cc", **buffers
        )
        wrapper.plan(
            kv_indptr.pin_memory(),
            indices,
            last_page_len.pin_memory(),
            q_heads,
            args.kv_heads,
            head_dim,
            args.page_size,
            q_data_type=q.dtype,
            kv_data_type=k.dtype,
            disable_split_kv=name == "fi_tc_nosplit",
        )
        return lambda: wrapper.run(q, (k, v))
    if name == "xqa":
        from flashinfer.decode import trtllm_batch_decode_with_kv_cache

        # its first 8 MB are semaphores that must start at zero: not the shared workspace
        xqa_ws = torch.zeros(128 << 20, dtype=torch.uint8, device=q.device)
        seq_lens = torch.full((bs,), req_to_token.shape[1], dtype=torch.int32, device=q.device)
        return lambda: trtllm_batch_decode_with_kv_cache(
            q, (k, v), xqa_ws, req_pages, seq_lens, req_pages.shape[1] * args.page_size,
            bmm1_scale=head_dim**-0.5, kv_layout="NHD", backend="xqa",
        )  # fmt: skip
    from mini_sglang.layers.attention.triton_ops import decode_attention_fwd

    splits = args.triton_splits
    out = torch.empty_like(q)
    mid_o = torch.empty((bs, q_heads, splits, head_dim), dtype=torch.float32, device=q.device)
    mid_lse = torch.empty((bs, q_heads, splits), dtype=torch.float32, device=q.device)
    flat_k = k.view(-1, args.kv_heads, head_dim)
    flat_v = v.view(-1, args.kv_heads, head_dim)
    rows = torch.arange(bs, dtype=torch.int64, device=q.device)
    seq_lens = torch.full((bs,), req_to_token.shape[1], dtype=torch.int64, device=q.device)

    def run():
        decode_attention_fwd(
            q, flat_k, flat_v, out, req_to_token, rows, seq_lens, mid_o, mid_lse,
            head_dim**-0.5,
        )  # fmt: skip
        return out

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64, 128, 256])
    ap.add_argument("--context", type=int, nargs="+", default=[512, 1024, 2048])
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--triton-splits", type=int, default=8)
    ap.add_argument("--kernels", nargs="+", default=list(DEFAULT_KERNELS), choices=KERNELS)
    ap.add_argument("--kv-dtype", default="bfloat16", choices=("bfloat16", "fp8_e4m3", "fp8_e5m2"))
    ap.add_argument("--out", default=None, help="append one JSON line per measurement")
    args = ap.parse_args()
    dev = "cuda"
    torch.manual_seed(0)
    workspace = torch.zeros(256 << 20, dtype=torch.uint8, device=dev)
    group = args.q_heads // args.kv_heads
    kv_dtype = {"bfloat16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn,
                "fp8_e5m2": torch.float8_e5m2}[args.kv_dtype]  # fmt: skip
    print(
        f"{'bs':>5}{'ctx':>6}"
        + "".join(f"{k + ' us':>12}{'TB/s':>7}{'err':>8}" for k in args.kernels)
    )
    for bs in args.batch_sizes:
        for ctx in args.context:
            pool = make_pool(bs, ctx, args.kv_heads, args.head_dim, args.page_size, dev, kv_dtype)
            k, v = pool[0], pool[1]
            q = torch.randn(bs, args.q_heads, args.head_dim, dtype=torch.bfloat16, device=dev)
            ref = reference(q, k, v, pool[3], group) if bs * ctx <= 65536 else None
            kv_bytes = bs * ctx * args.kv_heads * args.head_dim * 2 * k.element_size()
            row = f"{bs:>5}{ctx:>6}"
            for name in args.kernels:
                fn = kernel_fn(name, q, k, v, pool, args, workspace)
                err = (fn().float() - ref).abs().max().item() if ref is not None else float("nan")
                us = 1000 * cuda_time_ms(fn, iters=50, warmup=5, graph=is_graph_arm(name))
                tbs = kv_bytes / us / 1e6
                row += f"{us:>12.1f}{tbs:>7.2f}{err:>8.0e}"
                if args.out:
                    with open(args.out, "a") as f:
                        rec = {"kernel": name, "bs": bs, "ctx": ctx, "page_size": args.page_size,
                               "q_heads": args.q_heads, "kv_heads": args.kv_heads,
                               "head_dim": args.head_dim, "kv_dtype": args.kv_dtype,
                               "us": us, "kv_tb_s": tbs, "max_err": err,
                               "card": torch.cuda.get_device_name()}  # fmt: skip
                        f.write(json.dumps(rec) + "\n")
            print(row, flush=True)
            del pool, k, v, q, ref
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

"""Building flashinfer's paged-KV index arrays from req_to_token without a host sync.

For request r (row req_pool_indices[r] of req_to_token) with seq_len tokens in pages of
`page_size`, its page list is req_to_token[row, 0::page_size][:num_pages] // page_size, and
kv_indptr (prefix sums of num_pages, computed on the host from seq_lens_cpu) says where it
goes in the flat kv_indices. Example, page_size 4, seq_len 6, row = [40 41 42 43 8 9 ...]:
pages [10, 2], last_page_len 2.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the torch fallback below is used
    triton = None


if triton is not None:

    @triton.jit
    def _fill_kv_indices_kernel(
        req_to_token,
        req_pool_indices,
        kv_indptr,
        kv_indices,
        stride: tl.constexpr,
        PAGE: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        pid = tl.program_id(0)
        row = tl.load(req_pool_indices + pid).to(tl.int64)
        start = tl.load(kv_indptr + pid)
        n = tl.load(kv_indptr + pid + 1) - start
        for off in range(0, n, BLOCK):
            j = off + tl.arange(0, BLOCK)
            mask = j < n
            slot = tl.load(req_to_token + row * stride + j * PAGE, mask=mask, other=0)
            tl.store(kv_indices + start + j, slot // PAGE, mask=mask)


def fill_kv_indices(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    page_size: int,
    max_pages: int | None = None,
) -> None:
    """Write every request's page indices into kv_indices[kv_indptr[r]:kv_indptr[r+1]].

    All tensors live on the device; kv_indptr must already hold the prefix sums.
    """
    bs = req_pool_indices.shape[0]
    if bs == 0:
        return
    if triton is not None and req_to_token.is_cuda:
        _fill_kv_indices_kernel[(bs,)](
            req_to_token,
            req_pool_indices,
            kv_indptr,
            kv_indices,
            req_to_token.stride(0),
            page_size,
            512,
        )
        return
    indptr = kv_indptr.tolist()
    rows = req_pool_indices.tolist()
    for r in range(bs):
        n = indptr[r + 1] - indptr[r]
        pages = req_to_token[rows[r], 0 : n * page_size : page_size] // page_size
        kv_indices[indptr[r] : indptr[r + 1]] = pages.to(kv_indices.dtype)

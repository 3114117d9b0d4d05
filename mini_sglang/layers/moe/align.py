"""moe_align_block_size: the (token, expert) pairs of a batch sorted by expert, each expert's
run padded to a whole number of blocks, so a grouped GEMM can give every block one expert.

Given topk_ids [tokens, k] (local expert ids; a negative id is an expert this rank does not
hold and is dropped) and a block size B, it returns

- sorted_ids [max_padded] int32: flat pair indices (token * k + slot) grouped by expert in
  ascending expert order, each group in ascending pair order and padded with `tokens * k`
  (an index no pair has) up to a multiple of B; the tail after the last group is padding too;
- expert_ids [max_padded / B] int32: the expert of each block (-1 past the last group);
- num_post_padded [1] int32: where the last group's padding ends.

max_padded = n + min(n, E) * (B - 1) for n pairs and E experts is the most the padded groups
can need, so every size is known on the host: the result is CUDA-graph safe (no sync).

Worked example: ids [[1, 0], [1, 2]] (n 4), B 2, E 3: expert 0 has pair 1, expert 1 pairs 0
and 2, expert 2 pair 3 -> max_padded 4 + 3 * 1 = 7, rounded up to 8; sorted_ids
[1, 4, 0, 2, 3, 4, 4, 4], expert_ids [0, 1, 2, -1], num_post_padded [6].
"""

from __future__ import annotations

import torch

# The one-program Triton version holds [experts x pairs] masks in registers: it serves
# decode-sized batches (where launch count matters), torch the rest.
TRITON_MAX_PAIRS = 256
TRITON_MAX_EXPERTS = 256

_triton_kernel = None


def max_padded_pairs(num_pairs: int, num_experts: int, block_m: int) -> int:
    """The length of sorted_ids: an upper bound on the padded groups, rounded to a block."""
    bound = num_pairs + min(num_pairs, num_experts) * (block_m - 1)
    return -(-bound // block_m) * block_m


def moe_align_block_size_torch(
    topk_ids: torch.Tensor, block_m: int, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reference (torch ops only; see the module for the contract)."""
    dev = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    n = flat.numel()
    max_padded = max_padded_pairs(n, num_experts, block_m)
    key = torch.where((flat < 0) | (flat >= num_experts), num_experts, flat)
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=dev)
    counts.scatter_add_(0, key, torch.ones_like(key))
    padded = (counts[:num_experts] + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    # Dropped pairs go past max_padded, into a tail that is cut off below.
    starts = torch.cat([ends - padded, ends.new_full((1,), max_padded)])
    order = torch.argsort(key, stable=True)
    sorted_key = key[order]
    first = torch.cumsum(counts, 0) - counts  # where each key's run starts in `order`
    dest = starts[sorted_key] + torch.arange(n, device=dev) - first[sorted_key]
    buf = torch.full((max_padded + n,), n, dtype=torch.int32, device=dev)
    buf.scatter_(0, dest, order.to(torch.int32))
    blocks = torch.arange(max_padded // block_m, device=dev) * block_m
    expert_ids = torch.searchsorted(ends, blocks, right=True).to(torch.int32)
    expert_ids = torch.where(expert_ids < num_experts, expert_ids, -1)
    return buf[:max_padded], expert_ids, ends[-1:].to(torch.int32)


def _kernel():
    global _triton_kernel
    if _triton_kernel is None:
        import triton  # deferred: the CPU path never needs it
        import triton.language as tl

        @triton.jit
        def align_kernel(
            ids_ptr,
            sorted_ptr,
            expert_ids_ptr,
            post_pad_ptr,
            n,
            num_experts,
            max_padded,
            BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr,
            BLOCK_E: tl.constexpr,
            FILL: tl.constexpr,
        ):
            offs = tl.arange(0, BLOCK_N)
            live = offs < n
            e = tl.load(ids_ptr + offs, mask=live, other=-1)
            live = live & (e >= 0) & (e < num_experts)
            experts = tl.arange(0, BLOCK_E)
            hit = (e[None, :] == experts[:, None]) & live[None, :]  # [E, N]
            counts = tl.sum(hit.to(tl.int32), axis=1)
            padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
            ends = tl.cumsum(padded, axis=0)
            starts = ends - padded
            # padding everywhere first, then (after a barrier) each pair at its place
            for i in range(0, max_padded, FILL):
                fo = i + tl.arange(0, FILL)
                tl.store(sorted_ptr + fo, n, mask=fo < max_padded)
            tl.debug_barrier()
            same = (e[:, None] == e[None, :]) & (offs[None, :] < offs[:, None]) & live[None, :]
            rank = tl.sum(same.to(tl.int32), axis=1)
            start = tl.sum(tl.where(hit, starts[:, None], 0), axis=0)
            tl.store(sorted_ptr + start + rank, offs, mask=live)
            for b in range(0, max_padded // BLOCK_M, FILL):
                bo = b + tl.arange(0, FILL)
                before = tl.sum((ends[:, None] <= bo[None, :] * BLOCK_M).to(tl.int32), axis=0)
                before = tl.where(before < num_experts, before, -1)
                tl.store(expert_ids_ptr + bo, before, mask=bo < max_padded // BLOCK_M)
            tl.store(post_pad_ptr, tl.sum(padded, axis=0))

        _triton_kernel = align_kernel
    return _triton_kernel


def moe_align_block_size_triton(
    topk_ids: torch.Tensor, block_m: int, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """moe_align_block_size_torch in one Triton program; for at most TRITON_MAX_PAIRS pairs
    and TRITON_MAX_EXPERTS experts."""
    import triton

    ids = topk_ids.reshape(-1).to(torch.int32)
    n = ids.numel()
    max_padded = max_padded_pairs(n, num_experts, block_m)
    dev = ids.device
    sorted_ids = torch.empty(max_padded, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(max_padded // block_m, dtype=torch.int32, device=dev)
    post_pad = torch.empty(1, dtype=torch.int32, device=dev)
    _kernel()[(1,)](
        ids,
        sorted_ids,
        expert_ids,
        post_pad,
        n,
        num_experts,
        max_padded,
        BLOCK_M=block_m,
        BLOCK_N=max(16, triton.next_power_of_2(n)),
        BLOCK_E=max(16, triton.next_power_of_2(num_experts)),
        FILL=256,
        num_warps=8,
    )
    return sorted_ids, expert_ids, post_pad


def moe_align_block_size(
    topk_ids: torch.Tensor, block_m: int, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sorted_ids, expert_ids, num_post_padded); see the module for the contract."""
    if (
        topk_ids.is_cuda
        and topk_ids.numel() <= TRITON_MAX_PAIRS
        and num_experts <= TRITON_MAX_EXPERTS
    ):
        return moe_align_block_size_triton(topk_ids, block_m, num_experts)
    return moe_align_block_size_torch(topk_ids, block_m, num_experts)

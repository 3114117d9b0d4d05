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

# How the Triton version splits n pairs into programs (one chunk each), timed on one H100 as
# CUDA-graph replays at 128 experts, top-8 (benchmarks/bench_moe_align.py; microseconds):
#
#   tokens (pairs)     8 (64)  32 (256)  256 (2048)  1024 (8192)  4096 (32768)  8192 (65536)
#   256 pairs, 8 warps    4.6      16.6        20.2         25.0          40.5         117.4
#   128 pairs, 8 warps    4.8      10.4        10.4         22.2         100.1         357.2
#   64 pairs, 4 warps     5.6       7.3         8.2         16.2         107.8         389.5
#   512 pairs, SUB 64     5.1      16.2        32.1         33.6          41.2          51.5
#
# A chunk ranks its pairs either by comparing them with each other ([CHUNK, CHUNK] in
# registers: spills above 128 pairs on sm90, benchmarks/kernel_resources.py --align) or, for
# larger chunks, SUB pairs at a time by a running count per expert. Small chunks win while
# there are at most about MAX_CHUNKS of them; past that every program's pass over all
# chunks' counts dominates, so chunks grow to keep their number there.
SMALL_CHUNK = 64
MAX_CHUNKS = 128
SUB = 64
TRITON_MAX_EXPERTS = 256

_triton_kernels = None


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


def _kernels():
    global _triton_kernels
    if _triton_kernels is None:
        import triton  # deferred: the CPU path never needs it
        import triton.language as tl

        @triton.jit
        def count_kernel(
            ids_ptr, counts_ptr, n, num_experts, CHUNK: tl.constexpr, BLOCK_E: tl.constexpr
        ):
            """counts[g, e]: chunk g's kept pairs of expert e."""
            offs = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
            e = tl.load(ids_ptr + offs, mask=offs < n, other=-1)
            e = tl.where(e < num_experts, e, -1)  # dropped, as negative ids are
            hit = e[None, :] == tl.arange(0, BLOCK_E)[:, None]
            counts = tl.sum(hit.to(tl.int32), axis=1)
            tl.store(counts_ptr + tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E), counts)

        @triton.jit
        def place_kernel(
            ids_ptr,
            counts_ptr,
            sorted_ptr,
            expert_ids_ptr,
            post_pad_ptr,
            n,
            num_experts,
            max_padded,
            num_chunks,
            BLOCK_M: tl.constexpr,
            CHUNK: tl.constexpr,
            BLOCK_E: tl.constexpr,
            BLOCK_G: tl.constexpr,
            FILL: tl.constexpr,
            SINGLE: tl.constexpr,
            SUB: tl.constexpr,
        ):
            """Program g writes chunk g's pairs at their places, and its share of the
            padding, of expert_ids and (g 0) num_post_padded: every write lands where no other
            program writes, so nothing waits on another program.

            A pair's place: its expert's group start, plus the expert's pairs in earlier
            chunks, plus those earlier in its own chunk. Example (module docstring's ids,
            CHUNK 2): chunk 0 holds pairs 0, 1 (experts 1, 0), chunk 1 pairs 2, 3 (experts
            1, 2); starts [0, 2, 4]; pair 2 goes to 2 (expert 1's start) + 1 (pair 0, in
            chunk 0) + 0 = 3."""
            g = tl.program_id(0)
            experts = tl.arange(0, BLOCK_E)
            offs = g * CHUNK + tl.arange(0, CHUNK)
            live = offs < n
            e = tl.load(ids_ptr + offs, mask=live, other=-1)
            live = live & (e >= 0) & (e < num_experts)
            hit = (e[None, :] == experts[:, None]) & live[None, :]  # [BLOCK_E, CHUNK]
            if SINGLE:  # one chunk: the totals are its own counts
                total = tl.sum(hit.to(tl.int32), axis=1)
                before = tl.zeros([BLOCK_E], tl.int32)
            else:
                total = tl.zeros([BLOCK_E], tl.int32)
                before = tl.zeros([BLOCK_E], tl.int32)
                for g0 in range(0, num_chunks, BLOCK_G):
                    rows = g0 + tl.arange(0, BLOCK_G)
                    c = tl.load(
                        counts_ptr + rows[:, None] * BLOCK_E + experts[None, :],
                        mask=rows[:, None] < num_chunks,
                        other=0,
                    )
                    total += tl.sum(c, axis=0)
                    before += tl.sum(tl.where(rows[:, None] < g, c, 0), axis=0)
            padded = (total + BLOCK_M - 1) // BLOCK_M * BLOCK_M
            ends = tl.cumsum(padded, axis=0)
            starts = ends - padded
            if SUB == 0:  # rank by comparing the chunk's pairs with each other
                local = tl.arange(0, CHUNK)
                same = (e[:, None] == e[None, :]) & (local[None, :] < local[:, None])
                rank = tl.sum((same & live[None, :]).to(tl.int32), axis=1)
                base = tl.sum(tl.where(hit, (starts + before)[:, None], 0), axis=0)
                tl.store(sorted_ptr + base + rank, offs, mask=live)
            else:  # rank by a running count per expert, SUB pairs at a time
                seen = starts + before  # [BLOCK_E]: the next free place of each expert
                for s in range(0, CHUNK, SUB):
                    so = g * CHUNK + s + tl.arange(0, SUB)
                    es = tl.load(ids_ptr + so, mask=so < n, other=-1)
                    ls = (so < n) & (es >= 0) & (es < num_experts)
                    hs = ((es[None, :] == experts[:, None]) & ls[None, :]).to(tl.int32)
                    upto = tl.cumsum(hs, axis=1)  # [BLOCK_E, SUB]: pairs of e up to this one
                    place = tl.sum(tl.where(hs > 0, seen[:, None] + upto - 1, 0), axis=0)
                    tl.store(sorted_ptr + place, so, mask=ls)
                    seen += tl.sum(hs, axis=1)
            # the padding after each of this program's experts' pairs (experts g, g + G, ...)
            fill = (starts + total)[:, None] + tl.arange(0, BLOCK_M)[None, :]
            mine = (experts % num_chunks == g)[:, None] & (fill < ends[:, None])
            tl.store(sorted_ptr + fill, n, mask=mine)
            # the tail after the last group, and the blocks' experts, in strides of FILL
            post = tl.sum(padded, axis=0)
            for i in range(g * FILL, max_padded, num_chunks * FILL):
                fo = i + tl.arange(0, FILL)
                tl.store(sorted_ptr + fo, n, mask=(fo >= post) & (fo < max_padded))
            num_blocks = max_padded // BLOCK_M
            for b in range(g * FILL, num_blocks, num_chunks * FILL):
                bo = b + tl.arange(0, FILL)
                # blocks ending at or before this one's start: the index of its expert
                expert = tl.sum((ends[:, None] <= bo[None, :] * BLOCK_M).to(tl.int32), axis=0)
                expert = tl.where(expert < num_experts, expert, -1)
                tl.store(expert_ids_ptr + bo, expert, mask=bo < num_blocks)
            if g == 0:
                tl.store(post_pad_ptr, post)

        _triton_kernels = count_kernel, place_kernel
    return _triton_kernels


def launch_shape(num_pairs: int) -> tuple[int, int, int]:
    """(pairs per program, SUB or 0 to rank by comparison, warps) for num_pairs pairs.

    E.g. 64 pairs: one program of 64 on 8 warps; 2,048: 32 of 64 on 4 warps; 16,384: 128
    of 128 on 8 warps; 65,536: 128 of 512 ranked 64 at a time on 8 warps."""
    import triton

    if num_pairs <= SMALL_CHUNK:
        return max(16, triton.next_power_of_2(num_pairs)), 0, 8
    chunk = max(SMALL_CHUNK, triton.next_power_of_2(triton.cdiv(num_pairs, MAX_CHUNKS)))
    if chunk <= 2 * SMALL_CHUNK:  # ranked by comparison without spilling
        return chunk, 0, 4 if chunk == SMALL_CHUNK else 8
    return chunk, SUB, 8


def moe_align_block_size_triton(
    topk_ids: torch.Tensor,
    block_m: int,
    num_experts: int,
    shape: tuple[int, int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """moe_align_block_size_torch in Triton, for at most TRITON_MAX_EXPERTS experts: one
    program per chunk of pairs, after a launch that counts each chunk's pairs per expert
    (none for a single chunk, as in a decode step of up to 8 tokens of top-8). `shape`
    overrides launch_shape's (chunk, sub, warps); a chunk is a power of two."""
    import triton

    count_kernel, place_kernel = _kernels()
    ids = topk_ids.reshape(-1).to(torch.int32)
    n = ids.numel()
    max_padded = max_padded_pairs(n, num_experts, block_m)
    dev = ids.device
    sorted_ids = torch.empty(max_padded, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(max_padded // block_m, dtype=torch.int32, device=dev)
    post_pad = torch.empty(1, dtype=torch.int32, device=dev)
    chunk, sub, warps = shape or launch_shape(n)
    chunk = min(chunk, max(16, triton.next_power_of_2(n)))
    num_chunks = max(1, triton.cdiv(n, chunk))  # no pairs: one program writes the empty result
    block_e = max(16, triton.next_power_of_2(num_experts))
    counts = sorted_ids  # unread with one chunk
    if num_chunks > 1:
        counts = torch.empty(num_chunks, block_e, dtype=torch.int32, device=dev)
        count_kernel[(num_chunks,)](
            ids, counts, n, num_experts, CHUNK=chunk, BLOCK_E=block_e, num_warps=warps
        )
    place_kernel[(num_chunks,)](
        ids,
        counts,
        sorted_ids,
        expert_ids,
        post_pad,
        n,
        num_experts,
        max_padded,
        num_chunks,
        BLOCK_M=block_m,
        CHUNK=chunk,
        BLOCK_E=block_e,
        BLOCK_G=16,
        FILL=256,
        SINGLE=num_chunks == 1,
        SUB=min(sub, chunk),
        num_warps=warps,
    )
    return sorted_ids, expert_ids, post_pad


def moe_align_block_size(
    topk_ids: torch.Tensor, block_m: int, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sorted_ids, expert_ids, num_post_padded); see the module for the contract."""
    if topk_ids.is_cuda and num_experts <= TRITON_MAX_EXPERTS:
        return moe_align_block_size_triton(topk_ids, block_m, num_experts)
    return moe_align_block_size_torch(topk_ids, block_m, num_experts)

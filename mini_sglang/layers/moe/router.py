"""The MoE router: which top-k experts each token goes to, and with what weight.

`select_experts(router_logits, top_k, renormalize)` is softmax over all experts (in float32),
the top-k probabilities, and with `renormalize` those k divided by their sum (Mixtral always;
Qwen's `norm_topk_prob`). It returns (weights float32 [tokens, k], expert ids int32
[tokens, k]). On CUDA one Triton program per token does all of it (a decode step would
otherwise launch softmax, topk, sum and divide for every layer); elsewhere torch does.

Both paths order ties by expert index (the lower first), where torch.topk leaves the order
of ties unspecified. The Triton program is one warp running k rounds of argmax over the
token's row, each round one max over 64-bit (probability, index) keys. One warp because at
decode this kernel is latency between the router's GEMV and the experts: within a warp a
reduction is register shuffles or, for integers, one warp-reduce instruction (sm80+: the
keys take two a round, where a float max and an index min took two shuffle trees), while
four warps add a shared-memory exchange and a barrier to each reduction (19 barriers at
k = 8 in the compiled kernel; benchmarks/kernel_resources.py counts them).

`router_topk(x, gate_weight, ...)` (opt-in at decode: MINI_SGLANG_MOE_FUSED_ROUTER=1) runs
the router's GEMV and the top-k in one kernel: its programs each compute a slice of the
logits and the last one to finish routes, so a decode layer launches one kernel, not two.
"""

from __future__ import annotations

import torch

from mini_sglang.layers.kernels import gdc_launch_dependents, gdc_wait, triton


def select_experts_torch(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference router: transformers' order of operations, with torch.topk as a stable
    descending sort (ties to the lower index, as the Triton kernel breaks them)."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.sort(probs, dim=-1, descending=True, stable=True)
    weights, ids = weights[:, :top_k], ids[:, :top_k]
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


if triton is not None:
    import triton.language as tl

    from mini_sglang.layers.small_m_gemm import tile_product

    @triton.jit
    def topk_route(
        logits_row,
        num_experts,
        TOP_K: tl.constexpr,
        SLOTS: tl.constexpr,
        RENORMALIZE: tl.constexpr,
        BLOCK_E: tl.constexpr,
        VOLATILE: tl.constexpr = False,
    ):
        """(weights float32 [SLOTS], ids int32 [SLOTS]) of the row at logits_row: its
        TOP_K experts in select_experts_torch's order and weights; SLOTS is TOP_K rounded
        up to a power of two (the register block of the results), the padding slots hold
        weight 0. VOLATILE reads the row past L1 (it was written by other programs of the
        same kernel). Used by topk_softmax_kernel and router_topk_kernel."""
        offs = tl.arange(0, BLOCK_E)
        valid = offs < num_experts
        x = tl.load(logits_row + offs, mask=valid, other=-float("inf"), volatile=VOLATILE)
        x = x.to(tl.float32)
        p = tl.exp(x - tl.max(x, axis=0))
        p = tl.where(valid, p, 0.0)
        p = p / tl.sum(p, axis=0)
        # k rounds of argmax, each one max over a 64-bit key: p's bits above (a float >= 0
        # orders as its bits do) and BLOCK_E - 1 - index below, so equal probabilities
        # rank the lowest index first. One reduction a round where value and index took
        # two; taken keys and padding lanes hold -1. E.g. BLOCK_E 128, p[5] = p[9] = 0.25:
        # keys (bits(0.25) << 32) | 122 and | 118, so expert 5 comes first.
        bits = p.to(tl.int32, bitcast=True).to(tl.int64)
        keys = tl.where(valid, (bits << 32) | (BLOCK_E - 1 - offs).to(tl.int64), -1)
        slots = tl.arange(0, SLOTS)
        top = tl.zeros((SLOTS,), dtype=tl.int64)
        for k in tl.static_range(TOP_K):
            best = tl.max(keys, axis=0)
            top = tl.where(slots == k, best, top)
            keys = tl.where(keys == best, -1, keys)
        top_id = (BLOCK_E - 1 - (top & 0xFFFFFFFF)).to(tl.int32)
        top_w = (top >> 32).to(tl.int32).to(tl.float32, bitcast=True)
        top_w = tl.where(slots < TOP_K, top_w, 0.0)
        if RENORMALIZE:
            top_w = top_w / tl.sum(top_w, axis=0)  # the padding slots hold 0
        return top_w, top_id

    @triton.jit
    def topk_softmax_kernel(
        logits_ptr,
        weights_ptr,
        ids_ptr,
        num_experts,
        stride_row,
        TOP_K: tl.constexpr,
        SLOTS: tl.constexpr,
        RENORMALIZE: tl.constexpr,
        BLOCK_E: tl.constexpr,
        PDL: tl.constexpr,
    ):
        """Row program_id(0)'s TOP_K (weights, ids) (topk_route) into [rows, TOP_K]."""
        if PDL:  # the logits come from the kernel before
            gdc_launch_dependents()
            gdc_wait()
        row = tl.program_id(0)
        top_w, top_id = topk_route(
            logits_ptr + row * stride_row, num_experts, TOP_K, SLOTS, RENORMALIZE, BLOCK_E
        )
        slots = tl.arange(0, SLOTS)
        tl.store(weights_ptr + row * TOP_K + slots, top_w, mask=slots < TOP_K)
        tl.store(ids_ptr + row * TOP_K + slots, top_id, mask=slots < TOP_K)

    @triton.jit
    def _row_tile(rows, row_mask, k0, K, BK: tl.constexpr):
        """Columns [k0, k0 + BK) of the rows at `rows` [R, 1] (masked rows and columns past K
        read 0), as float32 [R, BK]."""
        cols = k0 + tl.arange(0, BK)
        tile = tl.load(rows + cols[None, :], mask=row_mask & (cols[None, :] < K), other=0.0)
        return tile.to(tl.float32)

    @triton.jit
    def router_topk_kernel(
        x_ptr, w_ptr, logits_ptr, weights_ptr, ids_ptr, counter_ptr, M, num_experts, K,
        stride_xm, stride_wn, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
        TOP_K: tl.constexpr, SLOTS: tl.constexpr, RENORMALIZE: tl.constexpr,
        BLOCK_E: tl.constexpr, PDL: tl.constexpr,
    ):  # fmt: skip
        """The router's GEMV and top-k in one kernel, for M <= BM tokens: program p computes
        logits [:, p*BN .. p*BN + BN) of every token (x @ w^T, rounded to the logits' dtype
        as the unfused GEMV's output) and stores them; the program that finishes last
        (counted by an atomic at counter_ptr, an int32 that is 0 between launches and that
        it resets) reads all logits back and writes each token's top-k (topk_route). The
        weight's first K tile is loaded before the PDL wait, as small_m_gemm's GEMV does.
        Worked example: 128 experts, BN 2: 64 programs; the 64th to increment the counter
        (which returns 63) routes every token."""
        rn = tl.program_id(0) * BN + tl.arange(0, BN)
        rm = tl.arange(0, BM)
        w_rows, w_mask = w_ptr + rn[:, None] * stride_wn, rn[:, None] < num_experts
        x_rows, x_mask = x_ptr + rm[:, None] * stride_xm, rm[:, None] < M
        wt = _row_tile(w_rows, w_mask, 0, K, BK)
        if PDL:  # x comes from the kernel before
            gdc_launch_dependents()
            gdc_wait()
        acc = tile_product(_row_tile(x_rows, x_mask, 0, K, BK), wt, x_ptr, False, False)
        for k0 in range(BK, K, BK):
            wt = _row_tile(w_rows, w_mask, k0, K, BK)
            acc += tile_product(_row_tile(x_rows, x_mask, k0, K, BK), wt, x_ptr, False, False)
        out_mask = x_mask & (rn[None, :] < num_experts)
        tl.store(logits_ptr + rm[:, None] * num_experts + rn[None, :],
                 acc.to(logits_ptr.dtype.element_ty), mask=out_mask)  # fmt: skip
        # every thread's stores before the count; acq_rel: the last program sees them all
        tl.debug_barrier()
        if tl.atomic_add(counter_ptr, 1, sem="acq_rel") == tl.num_programs(0) - 1:
            slots = tl.arange(0, SLOTS)
            for m in tl.static_range(BM):
                if m < M:
                    top_w, top_id = topk_route(logits_ptr + m * num_experts, num_experts,
                                               TOP_K, SLOTS, RENORMALIZE, BLOCK_E, True)  # fmt: skip
                    tl.store(weights_ptr + m * TOP_K + slots, top_w, mask=slots < TOP_K)
                    tl.store(ids_ptr + m * TOP_K + slots, top_id, mask=slots < TOP_K)
            tl.store(counter_ptr, 0)

else:  # CPU installs: torch routes
    topk_route = topk_softmax_kernel = router_topk_kernel = None

# the top-k kernel's launch: one warp (see the module)
TOPK_NUM_WARPS = 1


def topk_constants(top_k: int, num_experts: int) -> dict:
    """topk_softmax_kernel's shape constants for k of num_experts: SLOTS and BLOCK_E."""
    return {
        "SLOTS": triton.next_power_of_2(top_k),
        "BLOCK_E": triton.next_power_of_2(num_experts),
    }


def select_experts_triton(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """select_experts_torch in one Triton kernel. It launches as a programmatic dependent
    where kernels.pdl_enabled(router_logits) (a decode step's few tokens)."""
    from mini_sglang.layers.kernels import pdl_enabled

    tokens, num_experts = router_logits.shape
    logits = router_logits.contiguous()
    weights = torch.empty(tokens, top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(tokens, top_k, dtype=torch.int32, device=logits.device)
    if tokens:
        pdl = pdl_enabled(logits)
        topk_softmax_kernel[(tokens,)](
            logits,
            weights,
            ids,
            num_experts,
            logits.stride(0),
            TOP_K=top_k,
            RENORMALIZE=renormalize,
            **topk_constants(top_k, num_experts),
            PDL=pdl,
            num_warps=TOPK_NUM_WARPS,
            launch_pdl=pdl,
        )
    return weights, ids


# router_topk's tiles: BN experts a program, one warp each, the hidden row in K steps of up
# to 2048 // BM. One warp, so the last program's top-k is the one-warp kernel's (no shared
# memory exchange per round); BN 2 keeps its weight tile at 128 registers (sm90, BM 1;
# benchmarks/kernel_resources.py's resources()): 128 experts are 64 programs.
ROUTER_BN = 2
ROUTER_NUM_WARPS = 1
ROUTER_MAX_TOKENS = 4
_counters: dict[torch.device, torch.Tensor] = {}


def router_topk(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    top_k: int,
    renormalize: bool,
    pdl: bool = False,
    logits: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """select_experts(x @ gate_weight^T, ...) for x [M <= ROUTER_MAX_TOKENS, H] in one kernel
    (router_topk_kernel): the logits never leave for a second kernel, which a decode step
    would otherwise launch (and wait for) in every MoE layer. The logits are rounded to x's
    dtype first, as the router GEMV's output is. pdl launches it as a programmatic
    dependent (kernels.pdl_enabled). `logits` [M, E] in x's dtype, if given, receives the
    logits the routing was computed from (else a scratch tensor does)."""
    m, k = x.shape
    num_experts = gate_weight.shape[0]
    assert 0 < m <= ROUTER_MAX_TOKENS and x.stride(1) == 1 and gate_weight.stride(1) == 1
    counter = _counters.get(x.device)
    if counter is None:  # zero between launches: each launch's last program resets it
        counter = _counters[x.device] = torch.zeros(1, dtype=torch.int32, device=x.device)
    if logits is None:
        logits = torch.empty(m, num_experts, dtype=x.dtype, device=x.device)
    assert logits.shape == (m, num_experts) and logits.dtype == x.dtype and logits.is_contiguous()
    weights = torch.empty(m, top_k, dtype=torch.float32, device=x.device)
    ids = torch.empty(m, top_k, dtype=torch.int32, device=x.device)
    bm = triton.next_power_of_2(m)
    router_topk_kernel[(triton.cdiv(num_experts, ROUTER_BN),)](
        x, gate_weight, logits, weights, ids, counter, m, num_experts, k, x.stride(0),
        gate_weight.stride(0), BM=bm, BN=ROUTER_BN, BK=min(triton.next_power_of_2(k), 2048 // bm),
        TOP_K=top_k, RENORMALIZE=renormalize, **topk_constants(top_k, num_experts), PDL=pdl,
        num_warps=ROUTER_NUM_WARPS, launch_pdl=pdl,
    )  # fmt: skip
    return weights, ids


def select_experts(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights float32 [tokens, top_k], expert ids int32 [tokens, top_k]); see the module."""
    if router_logits.is_cuda and triton is not None:
        return select_experts_triton(router_logits, top_k, renormalize)
    return select_experts_torch(router_logits, top_k, renormalize)

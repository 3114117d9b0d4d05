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

    @triton.jit
    def topk_route(
        logits_row,
        num_experts,
        TOP_K: tl.constexpr,
        SLOTS: tl.constexpr,
        RENORMALIZE: tl.constexpr,
        BLOCK_E: tl.constexpr,
    ):
        """(weights float32 [SLOTS], ids int32 [SLOTS]) of the row at logits_row: its
        TOP_K experts in select_experts_torch's order and weights; SLOTS is TOP_K rounded
        up to a power of two (the register block of the results), the padding slots hold
        weight 0. Used by topk_softmax_kernel."""
        offs = tl.arange(0, BLOCK_E)
        valid = offs < num_experts
        x = tl.load(logits_row + offs, mask=valid, other=-float("inf")).to(tl.float32)
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

else:  # CPU installs: torch routes
    topk_route = topk_softmax_kernel = None

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


def select_experts(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights float32 [tokens, top_k], expert ids int32 [tokens, top_k]); see the module."""
    if router_logits.is_cuda and triton is not None:
        return select_experts_triton(router_logits, top_k, renormalize)
    return select_experts_torch(router_logits, top_k, renormalize)

"""The MoE router: which top-k experts each token goes to, and with what weight.

`select_experts(router_logits, top_k, renormalize)` is softmax over all experts (in float32),
the top-k probabilities, and with `renormalize` those k divided by their sum (Mixtral always;
Qwen's `norm_topk_prob`). It returns (weights float32 [tokens, k], expert ids int32
[tokens, k]). On CUDA one Triton program per token does all of it (a decode step would
otherwise launch softmax, topk, sum and divide for every layer); elsewhere torch does.
"""

from __future__ import annotations

import torch

_triton_kernel = None


def select_experts_torch(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference router (transformers' order of operations)."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


def _kernel():
    global _triton_kernel
    if _triton_kernel is None:
        import triton  # deferred: the CPU path never needs it
        import triton.language as tl

        from mini_sglang.layers.kernels import gdc_launch_dependents, gdc_wait

        @triton.jit
        def topk_softmax_kernel(
            logits_ptr,
            weights_ptr,
            ids_ptr,
            num_experts,
            stride_row,
            TOP_K: tl.constexpr,
            RENORMALIZE: tl.constexpr,
            BLOCK_E: tl.constexpr,
            PDL: tl.constexpr,
        ):
            if PDL:  # the logits come from the kernel before
                gdc_launch_dependents()
                gdc_wait()
            row = tl.program_id(0)
            offs = tl.arange(0, BLOCK_E)
            valid = offs < num_experts
            x = tl.load(logits_ptr + row * stride_row + offs, mask=valid, other=-float("inf"))
            x = x.to(tl.float32)
            p = tl.exp(x - tl.max(x, axis=0))
            p = tl.where(valid, p, 0.0)
            p = p / tl.sum(p, axis=0)
            remaining = tl.where(valid, p, -1.0)
            ks = tl.arange(0, TOP_K)
            top_w = tl.zeros((TOP_K,), dtype=tl.float32)
            top_id = tl.zeros((TOP_K,), dtype=tl.int32)
            # k rounds of argmax; the lowest index wins a tie, as torch.topk's CPU path does
            for k in tl.static_range(TOP_K):
                best = tl.max(remaining, axis=0)
                idx = tl.min(tl.where(remaining == best, offs, BLOCK_E), axis=0)
                top_w = tl.where(ks == k, best, top_w)
                top_id = tl.where(ks == k, idx, top_id)
                remaining = tl.where(offs == idx, -1.0, remaining)
            if RENORMALIZE:
                top_w = top_w / tl.sum(top_w, axis=0)
            tl.store(weights_ptr + row * TOP_K + ks, top_w)
            tl.store(ids_ptr + row * TOP_K + ks, top_id)

        _triton_kernel = topk_softmax_kernel
    return _triton_kernel


def select_experts_triton(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """select_experts_torch in one Triton kernel; top_k must be a power of two (the k
    results are one block of registers). It launches as a programmatic dependent where
    kernels.pdl_enabled(router_logits) (a decode step's few tokens)."""
    import triton

    from mini_sglang.layers.kernels import pdl_enabled

    tokens, num_experts = router_logits.shape
    logits = router_logits.contiguous()
    weights = torch.empty(tokens, top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(tokens, top_k, dtype=torch.int32, device=logits.device)
    if tokens:
        pdl = pdl_enabled(logits)
        _kernel()[(tokens,)](
            logits,
            weights,
            ids,
            num_experts,
            logits.stride(0),
            TOP_K=top_k,
            RENORMALIZE=renormalize,
            BLOCK_E=triton.next_power_of_2(num_experts),
            PDL=pdl,
            launch_pdl=pdl,
        )
    return weights, ids


def select_experts(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights float32 [tokens, top_k], expert ids int32 [tokens, top_k]); see the module."""
    if router_logits.is_cuda and top_k & (top_k - 1) == 0:
        return select_experts_triton(router_logits, top_k, renormalize)
    return select_experts_torch(router_logits, top_k, renormalize)

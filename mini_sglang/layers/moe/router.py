"""The MoE router: which top-k experts each token goes to, and with what weight.

`select_experts(router_logits, top_k, renormalize)` is softmax over all experts (in float32),
the top-k probabilities, and with `renormalize` those k divided by their sum (Mixtral always;
Qwen's `norm_topk_prob`). It returns (weights float32 [tokens, k], expert ids int32
[tokens, k]). On CUDA one Triton program per token does all of it (a decode step would
otherwise launch softmax, topk, sum and divide for every layer); elsewhere torch does.

At decode the expert kernels can route for themselves (`KernelRouting`, used by
layers/moe/fused_moe_gemv.py): they run the same device function (`topk_slots`) on the
token's logits row, and the top-k kernel's launch goes.

The Triton top-k ranks every expert instead of running k rounds of argmax: expert e's rank
is the number of experts f ahead of it, p[f] > p[e] or p[f] == p[e] with f < e (the lower
index wins a tie, as a stable descending sort orders them; torch.topk leaves the order of
ties unspecified), and the experts of rank < k are the top k, in order. Example,
p = [0.1, 0.4, 0.1, 0.4], k = 2: ranks [2, 0, 3, 1], so ids [1, 3].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mini_sglang.layers.kernels import gdc_launch_dependents, gdc_wait, triton


def select_experts_torch(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference router (transformers' order of operations)."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


if triton is not None:
    import triton.language as tl

    @triton.jit
    def topk_slots(
        row_ptr,
        num_experts,
        TOP_K: tl.constexpr,
        SLOTS: tl.constexpr,
        RENORMALIZE: tl.constexpr,
        BLOCK_E: tl.constexpr,
        CHUNK: tl.constexpr,
    ):
        """(ids int32 [SLOTS], weights float32 [SLOTS]) of one row of router logits: slot
        j < TOP_K holds the expert of rank j (see the module) and its softmax probability,
        renormalised over the top k with RENORMALIZE; slots from TOP_K on are padding.

        The ranks are counted CHUNK experts at a time against all BLOCK_E ([CHUNK, BLOCK_E]
        comparisons) in a loop the compiler does not unroll: one [BLOCK_E, BLOCK_E]
        comparison, or an unrolled loop, holds more registers than a routing kernel's main
        loop (fused_moe_gemv's gate_up kernel: 64 against 32 a thread, half its programs
        per SM; benchmarks/kernel_resources.py). A chunk's probabilities are taken from the
        row's registers (a masked sum over the rows of its [BLOCK_E / CHUNK, CHUNK] view:
        the same bits), not reloaded."""
        offs = tl.arange(0, BLOCK_E)
        valid = offs < num_experts
        x = tl.load(row_ptr + offs, mask=valid, other=-float("inf")).to(tl.float32)
        p = tl.exp(x - tl.max(x, axis=0))
        p = tl.where(valid, p, 0.0)
        key = tl.where(valid, p / tl.sum(p, axis=0), -1.0)  # padding ranks after every expert
        key_chunks = tl.reshape(key, (BLOCK_E // CHUNK, CHUNK))
        chunk_ids = tl.arange(0, BLOCK_E // CHUNK)
        slots = tl.arange(0, SLOTS)
        ids = tl.zeros((SLOTS,), dtype=tl.int32)
        weights = tl.zeros((SLOTS,), dtype=tl.float32)
        top = tl.zeros((CHUNK,), dtype=tl.float32)
        for c in range(0, BLOCK_E // CHUNK):
            kc = tl.sum(tl.where(chunk_ids[:, None] == c, key_chunks, 0.0), axis=0)
            oc = c * CHUNK + tl.arange(0, CHUNK)
            # expert e of this chunk: how many experts f are ahead of it
            ahead = (key[None, :] > kc[:, None]) | (
                (key[None, :] == kc[:, None]) & (offs[None, :] < oc[:, None])
            )
            rank = tl.sum(ahead.to(tl.int32), axis=1)
            sel = rank[None, :] == slots[:, None]
            ids += tl.sum(tl.where(sel, oc[None, :], 0), axis=1)
            weights += tl.sum(tl.where(sel, kc[None, :], 0.0), axis=1)
            top += tl.where(rank < TOP_K, kc, 0.0)
        top_sum = tl.sum(top, axis=0)
        if RENORMALIZE:
            weights = weights / top_sum
        return ids, weights

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
        CHUNK: tl.constexpr,
        PDL: tl.constexpr,
    ):
        if PDL:  # the logits come from the kernel before
            gdc_launch_dependents()
            gdc_wait()
        row = tl.program_id(0)
        ids, weights = topk_slots(
            logits_ptr + row * stride_row, num_experts, TOP_K, SLOTS, RENORMALIZE, BLOCK_E,
            CHUNK,
        )  # fmt: skip
        slots = tl.arange(0, SLOTS)
        tl.store(weights_ptr + row * TOP_K + slots, weights, mask=slots < TOP_K)
        tl.store(ids_ptr + row * TOP_K + slots, ids, mask=slots < TOP_K)

else:  # CPU installs: torch routes
    topk_slots = topk_softmax_kernel = None


def topk_constants(top_k: int, num_experts: int) -> dict:
    """topk_slots' shape constants for k of num_experts: SLOTS, BLOCK_E, CHUNK."""
    block_e = triton.next_power_of_2(num_experts)
    return {"SLOTS": triton.next_power_of_2(top_k), "BLOCK_E": block_e, "CHUNK": min(8, block_e)}


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


def local_expert_ids(ids: torch.Tensor, first_expert: int, num_local: int) -> torch.Tensor:
    """ids as indices into this rank's experts [first_expert, first_expert + num_local);
    -1 for another rank's expert (expert parallelism)."""
    local = ids - first_expert
    return torch.where((local >= 0) & (local < num_local), local, -1)


@dataclass(frozen=True)
class KernelRouting:
    """select_experts left to the expert kernels (fused_moe_gemv): from `logits` [tokens, E]
    each computes the token's top-k itself (topk_slots, the top-k kernel's function), and
    the first writes the weights and this rank's expert ids (local_expert_ids) into the
    [tokens, k] buffers the experts are given. `fill` writes the same values with
    select_experts, for a path that does not route in its kernels."""

    logits: torch.Tensor
    top_k: int
    renormalize: bool
    first_expert: int = 0
    num_local: int | None = None  # None: every expert is local

    def buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Unwritten (weights float32, ids int32) [tokens, k] for the kernel to fill."""
        shape = (self.logits.shape[0], self.top_k)
        return (
            torch.empty(shape, dtype=torch.float32, device=self.logits.device),
            torch.empty(shape, dtype=torch.int32, device=self.logits.device),
        )

    @property
    def local_count(self) -> int:
        return self.logits.shape[1] if self.num_local is None else self.num_local

    def fill(self, weights: torch.Tensor, ids: torch.Tensor) -> None:
        w, i = select_experts(self.logits, self.top_k, self.renormalize)
        weights.copy_(w)
        ids.copy_(local_expert_ids(i, self.first_expert, self.local_count))

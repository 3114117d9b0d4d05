"""The experts' computation in plain torch: the CPU path and the reference of the kernel.

fused_experts_torch(x, w13, w2, topk_weights, topk_ids) returns, for every token t,
sum over its slots j of topk_weights[t, j] * expert_{topk_ids[t, j]}(x[t]), where
expert_e(h) = w2[e] @ (silu(w13[e][:I] @ h) * (w13[e][I:] @ h)) (w13 is [gate; up]). A
negative id (an expert another rank holds) contributes nothing. Each expert runs once on the
tokens routed to it, as transformers does, so the result matches transformers' MoE blocks
in float32 to rounding.

With `act_qdq` (FP8 experts: w13 and w2 are then the dequantized weights) each expert's
input rows and its SiLU-and-mul output go through act_qdq (quantize, dequantize) before
their GEMM: the function the w8a8 kernel computes, up to summation order.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def fused_experts_torch(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    act_qdq: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """x [tokens, H], w13 [E, 2I, H], w2 [E, H, I], topk_* [tokens, k] -> [tokens, H]."""
    out = torch.zeros_like(x)
    ids = topk_ids.long()
    qdq = act_qdq if act_qdq is not None else (lambda t: t)
    for e in torch.unique(ids[ids >= 0]).tolist():
        rows, slots = torch.where(ids == e)
        gate, up = F.linear(qdq(x[rows]), w13[e]).chunk(2, dim=-1)
        y = F.linear(qdq(F.silu(gate) * up), w2[e])
        y = y * topk_weights[rows, slots, None].to(y.dtype)
        out.index_add_(0, rows, y.to(out.dtype))
    return out

"""RMSNorm, with the residual add fused in as SGLang's layers expect.

`forward(x)` returns norm(x); `forward(x, residual)` returns (norm(x + residual), x + residual).
On CUDA the flashinfer kernels are used when available; at decode-sized batches (<= 8 rows)
on GPUs with programmatic dependent launch, fused_kernels.rmsnorm instead, which overlaps the
GEMV before it (see fused_kernels). The torch path is the reference.
"""

from __future__ import annotations

import torch
from torch import nn

from mini_sglang.layers import fused_kernels
from mini_sglang.layers.kernels import flashinfer_norm


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.variance_epsilon = eps

    def forward_native(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        orig_dtype = x.dtype
        if residual is not None:
            x = x + residual
            residual = x
        # Normalise in float32 as HF does, so CPU float32 and GPU bf16 both match HF.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        out = self.weight * xf.to(orig_dtype)
        return out if residual is None else (out, residual)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if fused_kernels.small_batch_pdl_ops(x):
            out = fused_kernels.rmsnorm(
                x, self.weight.data, self.variance_epsilon, residual, pdl=True
            )
            return out if residual is None else (out, residual)
        fi = flashinfer_norm() if x.is_cuda else None
        if fi is None or x.dim() != 2:
            return self.forward_native(x, residual)
        if residual is not None:
            # flashinfer's fused kernel updates x and residual in place.
            fi.fused_add_rmsnorm(x, residual, self.weight.data, self.variance_epsilon)
            return x, residual
        return fi.rmsnorm(x, self.weight.data, self.variance_epsilon)

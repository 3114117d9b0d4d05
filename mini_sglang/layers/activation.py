"""SiLU-and-multiply: the gated MLP activation, silu(x[..., :d]) * x[..., d:].

On CUDA: flashinfer's kernel, or at decode-sized batches (<= 8 rows) on GPUs with
programmatic dependent launch fused_kernels.silu_and_mul, which overlaps the GEMV before it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mini_sglang.layers import fused_kernels
from mini_sglang.layers.kernels import flashinfer_activation


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        if fused_kernels.small_batch_pdl_ops(x):
            return fused_kernels.silu_and_mul(x, pdl=True)
        fi = flashinfer_activation() if x.is_cuda else None
        if fi is not None:
            return fi.silu_and_mul(x)
        return F.silu(x[..., :d]) * x[..., d:]

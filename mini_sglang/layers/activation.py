"""SiLU-and-multiply: the gated MLP activation, silu(x[..., :d]) * x[..., d:]."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mini_sglang.layers.kernels import flashinfer_activation


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        fi = flashinfer_activation() if x.is_cuda else None
        if fi is not None:
            return fi.silu_and_mul(x)
        return F.silu(x[..., :d]) * x[..., d:]

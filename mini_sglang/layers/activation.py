"""Activations: SiLU-and-multiply, the gated MLP activation silu(x[..., :d]) * x[..., d:], and
the plain elementwise ones encoder MLPs name by HF `hidden_act` (get_act_fn).

On CUDA: flashinfer's kernel, or at decode-sized batches (<= 8 rows) on GPUs with
programmatic dependent launch fused_kernels.silu_and_mul, which overlaps the GEMV before it.
"""

from __future__ import annotations

from collections.abc import Callable

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


# HF `hidden_act` names of the plain (ungated) activations encoder MLPs use.
_ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_fast": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}


def get_act_fn(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The elementwise activation for an HF config's `hidden_act` (gelu is the exact, erf
    one; gelu_new / gelu_pytorch_tanh / gelu_fast the tanh approximation). Raises
    ValueError for a name not listed."""
    if name not in _ACTIVATIONS:
        raise ValueError(f"Unsupported activation {name!r}; supported: {sorted(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]

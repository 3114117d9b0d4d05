"""Attention backends; importing this package registers the built-in ones.

flashinfer and triton register lazily: their factories import the GPU libraries only when
a runner asks for them, so CPU installs never need them.
"""

from __future__ import annotations

from mini_sglang.layers.attention import torch_native_backend  # noqa: F401
from mini_sglang.layers.attention.base_attn_backend import ATTENTION_BACKENDS


def _flashinfer(runner):
    from mini_sglang.layers.attention.flashinfer_backend import FlashInferAttnBackend

    return FlashInferAttnBackend(runner)


def _triton(runner):
    from mini_sglang.layers.attention.triton_backend import TritonAttnBackend

    return TritonAttnBackend(runner, runner.server_args.triton_attention_num_kv_splits)


ATTENTION_BACKENDS.setdefault("flashinfer", _flashinfer)
ATTENTION_BACKENDS.setdefault("triton", _triton)

"""Attention backends: the built-in ones are registered here, and
`create_attention_backend` builds one by name.

flashinfer and triton register lazily: their factories import the GPU libraries only when
a runner asks for them, so CPU installs never need them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mini_sglang.layers.attention import torch_native_backend  # noqa: F401
from mini_sglang.layers.attention.base_attn_backend import ATTENTION_BACKENDS, AttentionBackend

if TYPE_CHECKING:
    from mini_sglang.config_slices import AttentionConfig
    from mini_sglang.model_executor.model_runner import ModelRunner


def _flashinfer(runner: ModelRunner, config: AttentionConfig) -> AttentionBackend:
    # Local: the module imports flashinfer, needed only when this backend is chosen.
    from mini_sglang.layers.attention.flashinfer_backend import FlashInferAttnBackend

    return FlashInferAttnBackend(runner)


def _triton(runner: ModelRunner, config: AttentionConfig) -> AttentionBackend:
    # Local: the module imports triton, needed only when this backend is chosen.
    from mini_sglang.layers.attention.triton_backend import TritonAttnBackend

    if not runner.token_to_kv_pool.triton_ok:
        raise ValueError(
            f"The triton attention backend cannot read a {runner.kv_dtype} KV cache on this "
            "GPU (compute capability 8.9 or later needed); use --attention-backend flashinfer "
            "or --kv-cache-dtype fp8_e5m2."
        )
    return TritonAttnBackend(runner, config.triton_attention_num_kv_splits)


ATTENTION_BACKENDS.setdefault("flashinfer", _flashinfer)
ATTENTION_BACKENDS.setdefault("triton", _triton)


def create_attention_backend(
    name: str, runner: ModelRunner, config: AttentionConfig
) -> AttentionBackend:
    """The backend registered as `name`, built for `runner` with its slice of the launch
    flags (`config`); ValueError naming the registered ones if there is none."""
    if name not in ATTENTION_BACKENDS:
        raise ValueError(
            f"Unknown attention backend {name!r}; available: {', '.join(sorted(ATTENTION_BACKENDS))}"
        )
    return ATTENTION_BACKENDS[name](runner, config)

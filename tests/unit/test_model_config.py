"""ModelConfig's start-up handling of the model's config against SGLang 0.5.4's ModelConfig.

--json-model-override-args sets every key on the loaded config (SGLang's
`config.update(overrides)`), also keys config.json lacks, and a dict for a nested sub-config
updates only the keys it names; a rope_scaling override keeps the checkpoint's rope_theta.
The derived context length follows SGLang's get_context_length (its keys, the rope factor),
and a longer --context-length is refused unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN.
Tiny configs only (no weights): each directory is written once per module.
"""

from __future__ import annotations

import json
import logging

import pytest

from mini_sglang.entrypoints.embedding_routes import matryoshka_error
from mini_sglang.model_config import ModelConfig
from mini_sglang.server_args import ServerArgs
from tests.conftest import tiny_config


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    """A Qwen2 config.json (max_position_embeddings 512, rope_theta 1e6)."""
    path = tmp_path_factory.mktemp("qwen2_cfg")
    tiny_config("qwen2", 256).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory):
    """A LLaVA config.json whose text_config is the tiny Llama's."""
    from transformers import CLIPVisionConfig, LlavaConfig

    path = tmp_path_factory.mktemp("llava_cfg")
    vision = CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
    )
    LlavaConfig(vision_config=vision, text_config=tiny_config("llama", 256)).save_pretrained(path)
    return str(path)


def _config(path: str, overrides: dict | None = None, **kw) -> ModelConfig:
    args = ServerArgs(
        model_path=path, device="cpu", json_model_override_args=json.dumps(overrides or {}), **kw
    )
    return ModelConfig.from_server_args(args)


def test_override_sets_keys_config_json_lacks(qwen2_dir):
    plain = _config(qwen2_dir)
    assert not hasattr(plain.hf_config, "matryoshka_dimensions")
    assert "does not support matryoshka" in matryoshka_error(plain.hf_config, 16, 64)
    cfg = _config(
        qwen2_dir,
        {"matryoshka_dimensions": [16, 32], "brand_new": {"a": 1}, "max_position_embeddings": 300},
    )
    assert cfg.hf_config.matryoshka_dimensions == [16, 32]
    assert cfg.hf_config.brand_new == {"a": 1}
    # The new key acts where mini-sglang reads it: /v1/embeddings' dimensions check.
    assert matryoshka_error(cfg.hf_config, 16, 64) is None
    assert "only supports [16, 32]" in matryoshka_error(cfg.hf_config, 8, 64)
    # A key config.json has is overridden as before.
    assert plain.context_len == 512 and cfg.context_len == 300


def test_override_of_a_sub_config_keeps_its_other_keys(llava_dir):
    cfg = _config(llava_dir, {"text_config": {"max_position_embeddings": 100, "extra": 7}})
    assert cfg.hf_full_config is not None
    assert cfg.hf_config is cfg.hf_full_config.text_config
    assert cfg.context_len == 100 and cfg.hf_config.extra == 7
    assert cfg.num_hidden_layers == 2 and cfg.hidden_size == 64
    assert cfg.hf_config.rope_parameters["rope_type"] == "llama3"


def test_eos_ids_come_from_the_top_level_config(llava_dir):
    """As SGLang's hf_eos_token_id: the top-level config's eos_token_id (here set by the
    override), the text_config's only where the top level has none."""
    assert _config(llava_dir).eos_token_ids == {151645}
    assert _config(llava_dir, {"eos_token_id": [7, 8]}).eos_token_ids == {7, 8}


def test_rope_scaling_override_keeps_the_base(qwen2_dir):
    """An override of rope_scaling alone (SGLang's usual way to stretch the context) scales
    the frequencies of the checkpoint's rope_theta; the base is not lost."""
    import torch

    from mini_sglang.layers.rotary_embedding import compute_inv_freq

    head_dim = 16
    base = 1e6 ** (-torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    plain = _config(qwen2_dir)
    torch.testing.assert_close(compute_inv_freq(plain.hf_config, head_dim)[0], base)
    cfg = _config(qwen2_dir, {"rope_scaling": {"rope_type": "linear", "factor": 2.0}})
    assert cfg.hf_config.rope_parameters["rope_theta"] == 1e6
    torch.testing.assert_close(compute_inv_freq(cfg.hf_config, head_dim)[0], base / 2)


@pytest.mark.parametrize(
    "overrides,expected",
    [
        ({}, 512),
        # The first of SGLang's context-length keys the config has wins.
        ({"seq_length": 300}, 300),
        ({"max_sequence_length": 200, "seq_length": 300}, 200),
        # A rope scaling factor stretches the stated length...
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, 1024),
        # ...unless the stated length is already the scaled one.
        (
            {
                "rope_scaling": {
                    "rope_type": "yarn",
                    "factor": 4.0,
                    "original_max_position_embeddings": 128,
                }
            },
            512,
        ),
    ],
)
def test_derived_context_length(qwen2_dir, overrides, expected):
    from mini_sglang.layers.rotary_embedding import get_rope

    cfg = _config(qwen2_dir, overrides)
    assert cfg.context_len == expected
    # Every position of the context has a row in the rope cache the model builds.
    rope = get_rope(cfg.hf_config, cfg.head_dim, cfg.hf_config.max_position_embeddings)
    assert rope.cos_sin_cache.shape[0] >= cfg.context_len


def test_context_length_longer_than_the_model_is_refused(qwen2_dir, monkeypatch, caplog):
    """--context-length up to the derived length is taken as given; longer is refused with
    SGLang's message unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN allows it (warning)."""
    # an earlier in-process server start may have left the root logger above WARNING
    caplog.set_level(logging.WARNING)
    assert _config(qwen2_dir, context_length=100).context_len == 100
    assert _config(qwen2_dir, context_length=512).context_len == 512
    monkeypatch.delenv("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", raising=False)
    with pytest.raises(ValueError, match=r"context_length \(1000\) is greater than the derived"):
        _config(qwen2_dir, context_length=1000)
    monkeypatch.setenv("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "1")
    assert _config(qwen2_dir, context_length=1000).context_len == 1000
    assert any("is greater than the derived" in r.getMessage() for r in caplog.records)

"""config_slices: the typed slices of ServerArgs that the runner and backends take."""

from __future__ import annotations

import dataclasses

import pytest

from mini_sglang.config_slices import AttentionConfig, GrammarConfig, ModelRunnerConfig
from mini_sglang.server_args import ServerArgs


@pytest.fixture
def args() -> ServerArgs:
    return ServerArgs(
        model_path="/models/m",
        device="cpu",
        random_seed=7,
        max_total_tokens=4096,
        cuda_graph_bs=[1, 2, 4],
        triton_attention_num_kv_splits=4,
        decode_attention_backend="torch_native",
    )


@pytest.mark.parametrize("slice_cls", [AttentionConfig, ModelRunnerConfig, GrammarConfig])
def test_each_field_is_the_server_arg_of_the_same_name(args, slice_cls):
    part = slice_cls.from_server_args(args)
    for field in dataclasses.fields(part):
        if field.name == "attention":
            assert part.attention == AttentionConfig.from_server_args(args)
            continue
        expected = getattr(args, field.name)
        got = getattr(part, field.name)
        assert got == (tuple(expected) if isinstance(expected, list) else expected), field.name


def test_slices_are_frozen(args):
    part = ModelRunnerConfig.from_server_args(args)
    with pytest.raises(dataclasses.FrozenInstanceError):
        part.page_size = 16
    assert part.cuda_graph_bs == (1, 2, 4) and part.attention.triton_attention_num_kv_splits == 4

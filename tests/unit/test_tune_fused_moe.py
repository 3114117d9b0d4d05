"""benchmarks/tune_fused_moe.py's shape arguments (CPU: the tuning itself needs CUDA): the
shape read from a model directory's config.json, and the (E, N) its config file is named for
at a tp / ep split, which must be the names the MoE layer looks up."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import tune_fused_moe

MODELS = Path(__file__).parents[2] / "benchmarks" / "models"


def test_model_config_gives_the_shape() -> None:
    args = tune_fused_moe.parse_args(["--model", str(MODELS / "mixtral-8x7b"), "--tp", "2"])
    assert (args.experts, args.top_k, args.hidden, args.inter) == (8, 2, 4096, 14336)
    assert tune_fused_moe.rank_shape(args) == (8, 7168)
    # Qwen-MoE fields (num_experts, moe_intermediate_size): the defaults' own model
    qwen = tune_fused_moe.parse_args(["--model", str(MODELS / "qwen3-30b-a3b")])
    assert (qwen.experts, qwen.top_k, qwen.hidden, qwen.inter) == (128, 8, 2048, 768)
    assert vars(qwen) | {"model": None} == vars(tune_fused_moe.parse_args([]))


def test_shape_flags_win_over_the_model() -> None:
    args = tune_fused_moe.parse_args(["--inter", "512", "--model", str(MODELS / "mixtral-8x7b")])
    assert (args.experts, args.inter) == (8, 512)


@pytest.mark.parametrize(
    "flags, shape",
    [([], (128, 768)), (["--tp", "2"], (128, 384)), (["--tp", "4", "--ep", "2"], (64, 384)),
     (["--tp", "2", "--ep", "2"], (64, 768))],
)  # fmt: skip
def test_rank_shape_names_the_layers_file(flags: list[str], shape: tuple[int, int]) -> None:
    assert tune_fused_moe.rank_shape(tune_fused_moe.parse_args(flags)) == shape


@pytest.mark.parametrize("flags", [["--tp", "2", "--ep", "4"], ["--ep", "3", "--tp", "3"],
                                   ["--tp", "5"]])  # fmt: skip
def test_uneven_split_exits(flags: list[str]) -> None:
    with pytest.raises(SystemExit, match="does not split"):
        tune_fused_moe.rank_shape(tune_fused_moe.parse_args(flags))

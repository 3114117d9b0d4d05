"""--tp-size / --ep-size against a mixture of experts, checked at launch from config.json
alone (entrypoints/startup.py check_tp_size): a split the expert layers cannot take is one
StartupError naming the flags and the model's numbers, before any process starts; the
splits they can take pass. The launch itself (one line, exit 1) is in
tests/server/test_launch_errors.py."""

from __future__ import annotations

import pytest

from mini_sglang.entrypoints.startup import StartupError, check_tp_size
from mini_sglang.server_args import ServerArgs


def _config_dir(tmp_path, arch: str, **over) -> str:
    from transformers import MixtralConfig, Qwen2MoeConfig

    common = dict(
        vocab_size=128, hidden_size=64, num_hidden_layers=1, num_attention_heads=8,
        num_key_value_heads=8, num_experts_per_tok=2,
    )  # fmt: skip
    if arch == "mixtral":
        cfg = MixtralConfig(**{**common, "intermediate_size": 30, "num_local_experts": 4, **over})
    else:
        cfg = Qwen2MoeConfig(
            **{**common, "intermediate_size": 64, "moe_intermediate_size": 30, "num_experts": 4,
               "shared_expert_intermediate_size": 48, **over}
        )  # fmt: skip
    cfg.save_pretrained(str(tmp_path))
    return str(tmp_path)


def _check(path: str, tp: int, ep: int) -> None:
    check_tp_size(ServerArgs(model_path=path, tp_size=tp, ep_size=ep, device="cpu"))


@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe"])
def test_splits_the_experts_take_pass(tmp_path, arch) -> None:
    # 4 experts of intermediate 30: whole experts on 2 or 4 ranks, or each expert shared
    # by 2 ranks (tp 4, ep 2); the Qwen2-MoE shared expert (48) splits 2 and 4 ways
    path = _config_dir(tmp_path, arch)
    for tp, ep in [(2, 2), (4, 4), (4, 2), (2, 1)]:
        _check(path, tp, ep)


@pytest.mark.parametrize(
    "arch, over, tp, ep, message",
    [
        ("mixtral", {"num_local_experts": 3}, 2, 2,
         "--ep-size 2 does not divide the model's 3 experts"),
        ("qwen2_moe", {}, 4, 1,
         "--tp-size 4 / --ep-size 1 = 4 ranks share each expert and do not divide its "
         "intermediate size 30; choose sizes whose quotient divides it"),
        ("qwen2_moe", {"shared_expert_intermediate_size": 36}, 8, 4,
         "--tp-size 8 does not divide the model's shared expert intermediate size 36"),
    ],
    ids=["experts", "expert-intermediate", "shared-expert"],
)  # fmt: skip
def test_splits_they_cannot_take_name_the_flags(tmp_path, arch, over, tp, ep, message) -> None:
    path = _config_dir(tmp_path, arch, **over)
    with pytest.raises(StartupError) as err:
        _check(path, tp, ep)
    assert str(err.value) == message

"""benchmarks/roofline.py's bytes-only bound (`--weights-tb-s`): the weights a decode step
reads, by batch size, from a model's config.json. The bound is what docs/performance
cites against the throughput targets, so its arithmetic is checked by hand here."""

from __future__ import annotations

import pytest

from benchmarks import roofline


def test_dense_step_reads_every_weight_once_at_any_batch() -> None:
    # Llama-3.1-8B: 32 layers of q/k/v/o (4096 + 2 * 1024 + 4096 rows of 4096) and
    # gate/up/down (3 x 14336 x 4096), plus the LM head (128256 x 4096), bf16
    params = 32 * ((4096 + 2048 + 4096) * 4096 + 3 * 14336 * 4096) + 128256 * 4096
    table = roofline.weight_step_us("llama-3.1-8b", 1.0, 256)
    assert table[1] == pytest.approx(2 * params / 1e6)
    assert table[256] == table[1]


def test_moe_step_reads_the_experts_its_tokens_chose() -> None:
    # Qwen3-30B-A3B at one token: attention (32 + 2 * 4 heads of 128, o 4096 wide), the
    # router (128 x 2048) and 8 of its 128 experts (3 x 768 x 2048) in each of 48 layers
    attn = (32 + 8) * 128 * 2048 + 4096 * 2048
    layer = attn + 128 * 2048 + 8 * 3 * 768 * 2048
    table = roofline.weight_step_us("qwen3-30b-a3b", 1.0, 256)
    assert table[1] == pytest.approx(2 * (48 * layer + 151936 * 2048) / 1e6)
    # 64 tokens choose 126 distinct experts on average (uniform routing): the step reads
    # nearly all of them, and more tokens add almost nothing
    all_experts = 2 * 48 * 128 * 3 * 768 * 2048 / 1e6
    assert table[64] - table[1] == pytest.approx(all_experts * (1 - (120 / 128) ** 64 - 1 / 16))
    assert table[256] - table[64] < 0.02 * table[256]

"""longrope (LongRopeRotaryEmbedding): a tiny random Llama whose rope is longrope, against
transformers, one prompt per batch: a prompt shorter than original_max_position_embeddings
uses the short factors, a longer one the long factors for every token (transformers picks
per sequence length, SGLang per batch; with one prompt per batch they agree). Prefill
logits at every position within 1e-3 in float32, as test_models_vs_hf.py.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import build_tiny_model, make_scheduler, prefill_logits

ORIGINAL = 16
MAX_POSITION = 64
HEAD_DIM = 16  # TINY_DECODER's hidden 64 / 4 heads


def _longrope() -> dict:
    half = HEAD_DIM // 2
    return {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "original_max_position_embeddings": ORIGINAL,
        "short_factor": [1.0 + 0.1 * i for i in range(half)],
        "long_factor": [1.0 + 2.0 * i for i in range(half)],
    }


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory, qwen_tokenizer):
    path = tmp_path_factory.mktemp("longrope")
    hf = build_tiny_model(
        "llama",
        path,
        qwen_tokenizer,
        max_position_embeddings=MAX_POSITION,
        rope_parameters=_longrope(),
    )
    assert hf.config.rope_parameters["rope_type"] == "longrope"
    return hf, make_scheduler(str(path), skip_tokenizer_init=True)


@pytest.mark.parametrize("length", [ORIGINAL - 4, ORIGINAL + 14])
def test_prefill_logits_match_transformers(tiny, length):
    hf, sched = tiny
    ids = [(7 * i + 3) % 500 + 10 for i in range(length)]
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0]
    got = prefill_logits(sched, [ids], all_positions=True).input_logits
    torch.testing.assert_close(got, want, atol=1e-3, rtol=0)

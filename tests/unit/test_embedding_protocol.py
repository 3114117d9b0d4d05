"""The OpenAI embedding / classify helpers of entrypoints/embedding_routes.py: Matryoshka
`dimensions` (allowed only where the config declares it; truncation keeps unit vectors
unit), base64 as little-endian float32, SGLang's classify entry, and the input conversion."""

from __future__ import annotations

import base64
from types import SimpleNamespace

import numpy as np
import pytest

from mini_sglang.entrypoints.embedding_routes import (
    MultimodalEmbeddingInput,
    classify_data,
    matryoshka_error,
    openai_to_internal,
    shape_embedding,
)


def test_matryoshka_dimensions():
    plain = SimpleNamespace()
    assert matryoshka_error(plain, None, 64) is None
    assert "does not support matryoshka" in matryoshka_error(plain, 8, 64)
    free = SimpleNamespace(is_matryoshka=True)
    assert matryoshka_error(free, 8, 64) is None
    assert "[1, 64]" in matryoshka_error(free, 65, 64)
    assert "[1, 64]" in matryoshka_error(free, 0, 64)
    listed = SimpleNamespace(matryoshka_dimensions=[16, 32])
    assert matryoshka_error(listed, 32, 64) is None
    assert "only supports [16, 32]" in matryoshka_error(listed, 8, 64)


def test_shape_embedding():
    unit = (np.arange(1, 9, dtype=np.float64) / np.linalg.norm(np.arange(1, 9))).tolist()
    cut = shape_embedding(unit, 4, "float")
    assert len(cut) == 4 and abs(np.linalg.norm(cut) - 1.0) < 1e-6
    assert np.allclose(cut, np.array(unit[:4]) / np.linalg.norm(unit[:4]), atol=1e-6)
    raw = [3.0, 4.0, 12.0]  # not a unit vector: truncated as is
    assert shape_embedding(raw, 2, "float") == [3.0, 4.0]
    encoded = shape_embedding(raw, None, "base64")
    assert np.frombuffer(base64.b64decode(encoded), dtype="<f4").tolist() == raw


def test_classify_data():
    d = classify_data(1, [0.0, 2.0], {0: "neg", 1: "pos"})
    assert d.index == 1 and d.label == "pos" and d.num_classes == 2
    assert abs(sum(d.probs) - 1.0) < 1e-6 and d.probs[1] > d.probs[0]
    # No label for the argmax, or no scores: SGLang's fallback.
    assert classify_data(0, [0.0, 0.0, 5.0], {0: "a", 1: "b"}).model_dump() == {
        "index": 0,
        "label": "Default",
        "probs": [1.0],
        "num_classes": 1,
    }
    assert classify_data(0, None, {0: "a"}).label == "Default"


def test_openai_to_internal():
    assert openai_to_internal("a").text == "a"
    assert openai_to_internal(["a", "b"]).text == ["a", "b"]
    assert openai_to_internal([1, 2]).input_ids == [1, 2]
    assert openai_to_internal([[1], [2]]).input_ids == [[1], [2]]
    items = [MultimodalEmbeddingInput(text="x"), MultimodalEmbeddingInput()]
    assert openai_to_internal(items).text == ["x", "padding"]
    with pytest.raises(ValueError, match="Image inputs"):
        openai_to_internal([MultimodalEmbeddingInput(text="x", image="img.png")])
